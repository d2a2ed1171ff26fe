"""Config schema: one-line errors that name the field and the allowed values; presets; planning checks."""

from __future__ import annotations

import pytest

from audit.config import AuditConfig, load_config, merge, preset_names
from audit.core.errors import UserInputError
from audit.core.schema import from_mapping
from audit.planning import plan_audit


def _error(data) -> str:
    with pytest.raises(UserInputError) as error:
        plan_audit(from_mapping(AuditConfig, data))
    message = str(error.value)
    assert "\n" not in message
    return message


def test_unknown_top_level_and_nested_fields():
    assert _error({"trainig": {}}).startswith("trainig: unknown field; allowed: name, seed, device, dataset")
    message = _error({"training": {"rouns": 3}})
    assert message.startswith("training.rouns: unknown field; allowed: rounds, sampling")


def test_bad_values_name_the_allowed_ones():
    assert "partition.name: 'random' is not allowed; allowed: iid, dirichlet, shards" in _error({"partition": {"name": "random"}})
    assert "training.rounds: must be >= 1, got 0" in _error({"training": {"rounds": 0}})
    assert "training.lr: must be a number" in _error({"training": {"lr": "fast"}})
    assert "defenses[1].epsilons[0]: must be >= 1e-06" in _error({"defenses": [{"name": "fedavg"},
                                                                               {"name": "dp-fedavg", "epsilons": [-1]}]})


def test_registry_and_parameter_errors():
    assert "defenses[0].name: unknown defense 'dp-fedavgg'; allowed: ae-dpfl, ddgauss, dp-fedavg," in _error(
        {"defenses": [{"name": "dp-fedavgg"}]})
    assert "defenses[0].params.noise_placement: 'server' is not allowed; allowed: client, aggregate" in _error(
        {"defenses": [{"name": "dp-fedavg", "params": {"noise_placement": "server"}}]})
    assert "defenses[0].params.clipp: unknown field; allowed: clip" in _error(
        {"defenses": [{"name": "dp-fedavg", "params": {"clipp": 1}}]})
    assert "defenses[0].epsilons: 'fedavg' is not a DP defense" in _error({"defenses": [{"name": "fedavg", "epsilons": [1]}]})
    assert "attacks[0].params.variants[0]: 'sideways' is not allowed" in _error(
        {"attacks": [{"name": "lira", "params": {"variants": ["sideways"]}}]})
    assert "membership.runs: attack 'lira' needs at least 4 runs, got 2" in _error({"membership": {"runs": 2}})
    assert "dataset.name: unknown dataset 'digitz'" in _error({"dataset": {"name": "digitz"}})
    assert "model.options.hiden: unknown option" in _error({"model": {"name": "mlp", "options": {"hiden": [3]}}})
    assert "training.aggregation: dp-fedavg needs 'uniform'" in _error({"training": {"aggregation": "weighted"}})
    assert ("device: 'cuda' is not a device of this machine; allowed: cpu" in _error({"device": "cuda"})
            or pytest.importorskip("torch").cuda.is_available())


def test_yaml_numbers_and_defaults():
    config = from_mapping(AuditConfig, {"defenses": [{"name": "dp-fedavg", "delta": "1e-6", "epsilons": [1, "2.5"]}]})
    assert config.defenses[0].delta == 1e-6 and config.defenses[0].epsilons == [1.0, 2.5]
    default = AuditConfig()
    assert default.dataset.name == "digits" and default.partition.clients == 20
    assert [d.name for d in default.defenses] == ["fedavg", "dp-fedavg"] and default.defenses[1].epsilons == [1.0, 4.0]
    assert default.membership.runs == 16 and default.membership.unit == "auto"
    assert [a.name for a in default.attacks] == ["lira", "rmia", "shokri", "loss-threshold", "record-canaries", "client-canaries",
                                                   "dirac-canaries", "gradient-inversion", "attribute-inference"]


def test_presets_and_merge(tmp_path):
    assert {"default", "smoke"} <= set(preset_names())
    smoke = load_config(preset_name="smoke")
    assert smoke.name == "smoke" and smoke.membership.runs == 8
    path = tmp_path / "c.yaml"
    path.write_text("preset: smoke\ntraining: {rounds: 3}\n")
    config = load_config(path)
    assert config.training.rounds == 3 and config.training.local_steps == 5  # merged key by key
    assert merge({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2]}}) == {"a": {"b": 1, "c": [2]}}
    with pytest.raises(UserInputError, match="preset: unknown preset 'nope'"):
        load_config(preset_name="nope")


def test_yaml_syntax_errors_are_one_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("training: {rounds: 3\n")
    with pytest.raises(UserInputError) as error:
        load_config(path)
    assert "\n" not in str(error.value) and "broken.yaml" in str(error.value)
    path.write_text("- just\n- a list\n")
    with pytest.raises(UserInputError, match="must be a mapping"):
        load_config(path)


@pytest.mark.parametrize("name", [p for p in preset_names() if p != "default"])
def test_every_preset_is_valid(name):
    from audit.planning import resolve_entries

    config = load_config(preset_name=name)
    specs, attacks = resolve_entries(config)
    assert specs and attacks


@pytest.mark.parametrize("name", ["blur-lus-proxy", "dp-fedsam-proxy", "udp-fl-proxy", "fl-top-proxy", "ldp-fl-proxy"])
def test_proxy_presets_plan_on_mnist(name):
    from tests.helpers import shared_data

    root = shared_data("mnist")
    plan = plan_audit(load_config(preset_name=name, overrides={"dataset": {"root": str(root)}}))
    assert len(plan.task.pool) == 8000 and all(e.claim.unit in ("client", "record", "weight", "none") for e in plan.experiments)
    # every client with data has some (under a zero-out design a client whose coin is off has none)
    coins = plan.membership.coins(0) if plan.membership.relation == "zero-out" else None
    sizes = [len(c) for i, c in enumerate(plan.clients[0]) if coins is None or coins[i]]
    assert sizes and min(sizes) >= 1

"""Hostile config values: every value below once trained first and then failed
with an internal error, a half-written output folder, or was accepted silently. Each must now be
refused in planning — exit code 2, one line naming the field and the allowed values, nothing
written inside or outside ``--out``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from audit.cli import main
from audit.core.devices import available_devices
from audit.core.extensions import NO_PLUGINS_ENV
from tests.helpers import tiny_config

TRAINING = {"rounds": 2, "local_steps": 1, "batch_size": 10, "lr": 0.1}


def tiny(**sections) -> str:
    """A seconds-long audit: digits, 4 clients, 2 rounds, 4 runs, no diagnostics."""
    base = {"dataset": {"name": "digits", "max_pool": 160, "max_test": 100}, "partition": {"clients": 4},
            "training": TRAINING, "membership": {"runs": 4}, "diagnostics": {"enabled": False}}
    return tiny_config(**{**base, **sections})


def attack(name: str, **params) -> dict:
    return {"attacks": [{"name": name, "params": params}]}


def refused(tmp_path: Path, capsys, config_text: str, *extra: str) -> str:
    """Run the config; assert exit 2, one stderr line, nothing written; return that line."""
    config = tmp_path / "hostile.yaml"
    config.write_text(config_text, encoding="utf-8")
    code = main(["run", str(config), "--out", str(tmp_path / "out"), "--quiet", *extra])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert set(tmp_path.rglob("*")) == {config}, "something was written"
    return lines[0]


MISSING_CUDA = f"cuda:{torch.cuda.device_count()}"  # one past the last CUDA device (cuda:0 on a CPU machine)


@pytest.mark.parametrize("device", ["meta", "xpu", "hip", "vulkan", "lazy", "cpu:7", "cuda:99", MISSING_CUDA, "mps:3",
                                    "", "CPU"])
@pytest.mark.parametrize("where", ["--device", "config"])
def test_devices_the_machine_lacks_are_refused_with_the_ones_it_has(tmp_path, capsys, device, where):
    if where == "config":
        line = refused(tmp_path, capsys, tiny(device=device))
    else:
        line = refused(tmp_path, capsys, tiny(), "--device", device)
    field = "--device" if where == "--device" else "device"
    assert line.startswith(f"dpfl-audit: error: {field}: '{device}' is not a device of this machine; allowed: cpu")
    assert line.endswith(", ".join(available_devices()))


def test_audit_training_refuses_a_device_before_loading_the_script(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "MARKER"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n\ndef train(x, y, seed):\n    raise SystemExit(3)\n")
    code = main(["audit-training", f"{script}:train", "--dataset", "digits", "--claim-epsilon", "1", "--delta", "1e-5",
                 "--device", "meta", "--out", str(tmp_path / "out"), "--quiet"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("dpfl-audit: error: --device: 'meta'"), lines
    assert set(tmp_path.iterdir()) == {script}


@pytest.mark.parametrize("sections, field, allowed", [
    # empty lists of diagnostics (the report template indexed their last entry)
    ({"diagnostics": {"enabled": True, "sharpness_radii": []}}, "diagnostics.sharpness_radii", "a list of 1 or more"),
    ({"diagnostics": {"enabled": True, "perturbation_stds": []}}, "diagnostics.perturbation_stds", "a list of 1 or more"),
    # model options
    ({"model": {"name": "resnet18-gn", "options": {"groups": 0}}}, "model.options.groups", "1, 2, 4, 8, 16, 32, 64"),
    ({"model": {"name": "resnet18-gn", "options": {"groups": -1}}}, "model.options.groups", "1, 2, 4, 8, 16, 32, 64"),
    ({"model": {"name": "resnet18-gn", "options": {"groups": 3}}}, "model.options.groups", "1, 2, 4, 8, 16, 32, 64"),
    ({"model": {"name": "mlp", "options": {"hidden": [float("inf")]}}}, "model.options.hidden[0]", "an integer"),
    ({"model": {"name": "mlp", "options": {"hidden": [2.5]}}}, "model.options.hidden[0]", "an integer"),
    # numbers beyond what float32 training holds
    ({"defenses": [{"name": "dp-fedavg", "params": {"noise_multiplier": 1e308}}]},
     "defenses[0].params.noise_multiplier", "x ≤ 1e+30"),
    ({"training": {**TRAINING, "lr": 1e308}}, "training.lr", "0 < x ≤ 1e+30"),
    ({"training": {**TRAINING, "server_lr": 1e31}}, "training.server_lr", "0 < x ≤ 1e+30"),
    # dataset options, ε, presets, client counts
    ({"dataset": {"name": "emnist", "options": {"split": ["letters"]}}}, "dataset.options.split", "byclass, bymerge"),
    ({"defenses": [{"name": "dp-fedavg", "epsilons": [5e-324]}]}, "defenses[0].epsilons[0]", "1e-06 ≤ x ≤ 1000"),
    ({"defenses": [{"name": "dp-fedavg", "epsilons": [1e-7]}]}, "defenses[0].epsilons[0]", "1e-06 ≤ x ≤ 1000"),
    ({"preset": ""}, "preset", "default"),
    ({"training": {**TRAINING, "sampling": "fixed", "clients_per_round": 6}}, "training.clients_per_round", "1 to 4"),
    ({"defenses": [{"name": "fedavg", "training": {"clients_per_round": 5}}]}, "defenses[0].training.clients_per_round",
     "1 to 4"),
    ({"record": {"upload_clients": [999]}}, "record.upload_clients", "0 to 3"),
    ({"record": {"upload_clients": [0, 4]}}, "record.upload_clients", "0 to 3"),
    # attack parameters against the experiment they will run on
    (attack("attribute-inference", attributes=["nope"]), "attacks[0].params.attributes", "sex"),
    (attack("attribute-inference", dataset="nope"), "attacks[0].params.dataset", "auto, diabetes, adult"),
    (attack("attribute-inference", dataset="digits"), "attacks[0].params.dataset", "auto, diabetes, adult"),
    (attack("attribute-inference", dataset="mnist"), "attacks[0].params.dataset", "auto, diabetes, adult"),
    (attack("gradient-inversion", round=99), "attacks[0].params.round", "1 to 2"),
    (attack("gradient-inversion", round=3), "attacks[0].params.round", "1 to 2"),
    (attack("gradient-inversion", clients=999), "attacks[0].params.clients", "1 to 4"),
    (attack("shokri", folds=999), "attacks[0].params.folds", "2 to 4"),
    (attack("canary-queries", folds=5), "attacks[0].params.folds", "2 to 4"),
    (attack("property-inference", property_class=999), "attacks[0].params.property_class", "0 to 9"),
    (attack("property-inference", property_class=10), "attacks[0].params.property_class", "0 to 9"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_values_that_trained_first_are_refused_in_planning(tmp_path, capsys, sections, field, allowed):
    line = refused(tmp_path, capsys, tiny(**sections))
    assert line.startswith(f"dpfl-audit: error: {field}: "), line
    assert "; allowed: " in line and allowed in line.split("; allowed: ", 1)[1], line


@pytest.mark.parametrize("index", ["²", "١", "0x0", "-0", " 0"])
def test_only_ascii_digits_index_a_list_in_set(tmp_path, capsys, index):
    line = refused(tmp_path, capsys, tiny(), "--set", f"defenses.{index}.name=fedavg")
    assert line.startswith("dpfl-audit: error: --set defenses.") and "allowed indices: 0–0" in line, line


def test_a_code_loading_side_dataset_is_refused_when_plugins_are_off(tmp_path, capsys, monkeypatch):
    # "" = plugins on; --no-plugins sets the variable for the process (and its workers), and the
    # monkeypatch restores it to unset after the test
    monkeypatch.setenv(NO_PLUGINS_ENV, "")
    line = refused(tmp_path, capsys, tiny(**attack("attribute-inference", dataset="os:getcwd")), "--no-plugins")
    assert line.startswith("dpfl-audit: error: attacks[0].params.dataset: 'os:getcwd'") and "plugins are off" in line


@pytest.mark.parametrize("sections", [
    attack("gradient-inversion", round=2, clients=4),
    attack("shokri", folds=4),
    attack("property-inference", property_class=9),
    attack("attribute-inference", attributes=["sex"]),
    {"training": {**TRAINING, "sampling": "fixed", "clients_per_round": 4}, "record": {"upload_clients": [0, 3]}},
], ids=["gradient-inversion", "shokri", "property-inference", "attribute-inference", "clients"])
def test_the_largest_allowed_values_pass_planning(tmp_path, sections):
    """The bounds are not off by one: the last allowed value plans (nothing is trained here)."""
    from audit.config import load_config
    from audit.planning import plan_audit

    config = tmp_path / "edge.yaml"
    config.write_text(tiny(**sections), encoding="utf-8")
    plan_audit(load_config(config))


def test_labels_with_mathtext_are_drawn_as_text(tmp_path, capsys):
    """A label is text, never matplotlib markup: ``$\\frac{$`` once raised a ParseFatalException while
    the figures were drawn, after training. (This one trains: the figures come after it.)"""
    import json

    labels = {"attack": "leak $\\frac{$", "defense": "$\\unknowncmd$ a\\$b"}
    config = tmp_path / "labels.yaml"
    config.write_text(tiny(attacks=[{"name": "loss-threshold", "label": labels["attack"]}],
                           defenses=[{"name": "fedavg", "label": labels["defense"]}]), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["run", str(config), "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    experiment = results["experiments"][0]
    assert experiment["label"] == labels["defense"] and experiment["attacks"][0]["attack"] == labels["attack"]
    assert (out / "report.html").is_file() and any((out / "figures").glob("roc-*.png"))


@pytest.mark.parametrize("text", ["leak $\\frac{$", "$\\unknowncmd$", "$x$ and $y$", "a\\$b", "$", "\\"])
def test_plain_text_reaches_matplotlib_as_the_user_wrote_it(text):
    import io

    from reports.plots import plain, plt

    figure, axis = plt.subplots()
    axis.plot([0, 1], [0, 1], label=plain(text))
    axis.set_title(plain(text))
    legend = axis.legend()
    figure.savefig(io.BytesIO(), format="png")  # raised ParseFatalException / ValueError before
    shown, is_math = axis.title._preprocess_math(axis.title.get_text())
    assert shown == text and not is_math
    assert legend.get_texts()[0]._preprocess_math(legend.get_texts()[0].get_text()) == (text, False)
    plt.close(figure)

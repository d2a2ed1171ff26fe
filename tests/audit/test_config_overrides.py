"""``--set PATH=VALUE`` and config merging that matches intent."""

from __future__ import annotations

import pytest
import yaml

from audit.cli import main
from audit.config import load_config
from audit.core.errors import UserInputError
from audit.planning import plan_audit
from tests.helpers import shared_data


def test_set_values_are_typed_as_yaml_and_land_where_the_path_says():
    config = load_config(preset_name="smoke", sets=["training.rounds=2", "training.lr=0.125", "name=my audit",
                                                    "defenses.1.epsilons=[1, 4]", "dataset.max_pool=64"])
    assert config.training.rounds == 2 and isinstance(config.training.rounds, int)
    assert config.training.lr == 0.125 and config.name == "my audit"
    assert config.defenses[1].epsilons == [1.0, 4.0] and config.defenses[0].name == "fedavg"
    assert config.dataset.max_pool == 64
    # the rest of the preset is untouched: the assignment overrides one value, not its section
    smoke = load_config(preset_name="smoke")
    assert (config.training.batch_size, config.partition, config.attacks) == (smoke.training.batch_size, smoke.partition,
                                                                             smoke.attacks)


def test_later_assignments_win_and_apply_after_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training: {rounds: 7, lr: 0.3}\n")
    config = load_config(path, sets=["training.rounds=3", "training.rounds=4"])
    assert (config.training.rounds, config.training.lr) == (4, 0.3)


@pytest.mark.parametrize("assignment, message", [
    ("training.rouns=2", "training.rouns: unknown field; allowed: rounds,"),
    ("trainin.rounds=2", "trainin: unknown field; allowed: name, seed,"),
    ("training.rounds=two", "training.rounds: "),
    ("seed.x=1", "--set seed.x: 'seed' is a value, not a section"),
    ("defenses.9.label=x", "--set defenses.9: 'defenses' is a list of 2 entries; allowed indices: 0–1"),
    ("rounds", "--set: 'rounds' is not PATH=VALUE"),
])
def test_a_bad_assignment_is_one_line_naming_the_field(assignment, message):
    with pytest.raises(UserInputError) as error:
        load_config(preset_name="smoke", sets=[assignment])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_run_refuses_a_misspelt_path_with_exit_2_one_line_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--preset", "smoke", "--set", "training.rouns=2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dpfl-audit: error: training.rouns: unknown field; allowed: rounds")
    assert not out.exists()


def test_naming_another_model_alone_starts_it_from_its_own_defaults(tmp_path):
    # the default model is mlp with options {hidden: [128]}: cnn-tiny has no such option
    config = load_config(sets=["model.name=cnn-tiny"])
    assert (config.model.name, config.model.options) == ("cnn-tiny", {})
    assert load_config(sets=["model.name=mlp"]).model.options == {"hidden": [128]}  # the same name keeps them
    # a config file that names only the model: the plan's every check passes (the model builds) on
    # MNIST's 28×28 images, the PyTorch example CNN's input ...
    path = tmp_path / "cnn.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": "cnn-tiny"}, "dataset": {
        "name": "mnist", "root": str(shared_data("mnist")), "options": {"download": False}, "max_pool": 200, "max_test": 50}}))
    plan_audit(load_config(path))
    # ... and on digits' 8×8 images its 5×5 kernels do not fit: one line naming the model, not its options
    with pytest.raises(UserInputError) as error:
        plan_audit(config)
    assert str(error.value).startswith("model.name: model 'cnn-tiny' cannot take inputs of shape (1, 8, 8)")
    plan_audit(load_config(sets=["model.name=cnn-udpfl"]))  # a padded CNN fits digits


def test_a_config_file_naming_another_model_dataset_or_partition_drops_the_previous_ones_fields(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "model": {"name": "mlp", "options": {"hidden": [32, 16]}},
        "dataset": {"name": "mnist", "root": "/data/mnist", "options": {"download": False}, "max_pool": 500},
        "partition": {"name": "dirichlet", "alpha": 0.1, "clients": 7}}))
    config = load_config(base, overrides={"model": {"name": "cnn-tiny"}, "dataset": {"name": "digits"},
                                          "partition": {"name": "shards"}})
    assert (config.model.name, config.model.options) == ("cnn-tiny", {})
    # the dataset's own files and loader options go with it; a generic cap stays
    assert (config.dataset.name, config.dataset.root, config.dataset.options, config.dataset.max_pool) == \
        ("digits", None, {}, 500)
    # dirichlet's α is no parameter of shards (back to the default); the number of clients stays
    assert (config.partition.name, config.partition.alpha, config.partition.clients) == ("shards", 0.5, 7)
    # options given with the new name are kept
    config = load_config(base, sets=["model={name: cnn-tiny, options: {}}", "partition.alpha=0.3"])
    assert config.model.name == "cnn-tiny" and config.partition.alpha == 0.3


def test_naming_another_defense_or_attack_drops_the_previous_ones_params():
    config = load_config(preset_name="smoke", sets=["defenses.1.params={noise_multiplier: 1.3}", "defenses.1.name=dp-fedsam"])
    assert config.defenses[1].name == "dp-fedsam" and config.defenses[1].params == {}
    assert config.defenses[1].epsilons == load_config(preset_name="smoke").defenses[1].epsilons


def test_config_command_prints_the_assigned_values(capsys):
    assert main(["config", "--preset", "smoke", "--set", "training.rounds=2", "--set", "model.name=cnn-tiny"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["training"]["rounds"] == 2 and printed["model"] == {"name": "cnn-tiny", "options": {}}


def test_the_tutorials_set_examples_resolve_as_described(capsys):
    from tests.helpers import DOCS, readme_commands

    page = DOCS / "tutorial" / "first-audit.md"
    (config_arguments,) = [a for a in readme_commands("dpfl-audit config", page) if "--set" in a]
    assert main(["config", *config_arguments]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"] == {"name": "cnn-udpfl", "options": {}}
    assert printed["defenses"][1]["name"] == "dp-fedsam" and printed["defenses"][1]["params"] == {}
    (run_arguments,) = [a for a in readme_commands("dpfl-audit run", page) if "--set" in a]
    sets = [run_arguments[i + 1] for i, word in enumerate(run_arguments) if word == "--set"]
    config = load_config(preset_name=run_arguments[run_arguments.index("--preset") + 1], sets=sets)
    assert config.training.rounds == 2 and config.defenses[1].epsilons == [1.0, 4.0]

"""A stored run whose files are truncated, garbage or missing is one line naming the run folder and
how to discard it — never a safetensors/numpy/json traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from audit import store_seal
from audit.cli import main
from audit.core.errors import UserInputError
from audit.store import RunStore
from tests.helpers import tiny_config

RUN = "exp-r000-0123456789ab"


def _save(store: RunStore) -> dict[str, torch.Tensor]:
    params = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3)}
    store.save_run(RUN, {"run_id": RUN, "utility": {"test_accuracy": 0.5}}, params, np.arange(40),
                   [{"round": r, "test_accuracy": 0.1 * r} for r in (1, 2, 3)],
                   global_models={f"round_{r:04d}": torch.full((15,), float(r)) for r in (1, 2)})
    return params


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble(path: Path) -> None:
    path.write_bytes(b"\x80\x04garbage, not what was written\xff" * 3)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _remove(path: Path) -> None:
    path.unlink()


LOADERS = {
    "model.safetensors": lambda store: store.load_params(RUN),
    "membership.npy": lambda store: store.load_membership(RUN),
    "manifest.json": lambda store: store.load_manifest(RUN),
    "metrics.jsonl": lambda store: store.load_metrics(RUN),
    "global_models.safetensors": lambda store: store.load_tensor(RUN, "global_models", "round_0002"),
}
DAMAGE = {"truncated": _truncate, "garbage": _garble, "empty": _empty, "missing": _remove}
#: every file with every damage, except: a run without its manifest is not finished (it is retrained,
#: not loaded), and an empty metrics.jsonl is a valid file of no rounds
CASES = [(name, damage) for name in sorted(LOADERS) for damage in sorted(DAMAGE)
         if (name, damage) not in {("manifest.json", "missing"), ("metrics.jsonl", "empty")}]


def test_an_intact_run_loads(tmp_path):
    store = RunStore(tmp_path / "out")
    params = _save(store)
    assert all(torch.equal(store.load_params(RUN)[k], v) for k, v in params.items())
    assert store.load_membership(RUN).tolist() == list(range(40))
    assert store.load_manifest(RUN)["run_id"] == RUN
    assert [row["round"] for row in store.load_metrics(RUN)] == [1, 2, 3]
    assert store.load_tensor(RUN, "global_models", "round_0002").tolist() == [2.0] * 15
    assert list(store.load_tensors(RUN, "global_models")) == ["round_0001", "round_0002"]


@pytest.mark.parametrize("name, damage", CASES)
def test_a_damaged_file_is_one_line_naming_the_run_folder(tmp_path, name, damage):
    store = RunStore(tmp_path / "out")
    _save(store)
    DAMAGE[damage](store.path(RUN) / name)
    with pytest.raises(UserInputError) as caught:
        LOADERS[name](store)
    message = str(caught.value)
    folder = tmp_path / "out" / "runs" / RUN
    assert message.startswith(f"stored run '{folder}' is corrupted ({name}: "), message
    assert message.endswith("); delete that folder and rerun the same command to retrain it"), message
    assert "\n" not in message and len(message) < 400
    if damage == "missing":
        assert f"({name}: missing)" in message


def test_wrong_content_that_parses_is_refused_too(tmp_path):
    """Behind the seal, each file is still read strictly: content that was sealed (as a bug of the
    writer would seal it) but is not what a run holds is one line too."""
    store = RunStore(tmp_path / "out")
    _save(store)
    folder = store.path(RUN)
    (folder / "manifest.json").write_text("[1, 2, 3]\n")
    store_seal.write(folder, RUN)
    with pytest.raises(UserInputError, match=r"\(manifest.json: not a JSON object\)"):
        store.load_manifest(RUN)
    (folder / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2\n')
    store_seal.write(folder, RUN)
    with pytest.raises(UserInputError, match=r"\(metrics.jsonl: line 2 is not valid JSON"):
        store.load_metrics(RUN)
    (folder / "metrics.jsonl").write_text('{"round": 1}\n"two"\n')
    store_seal.write(folder, RUN)
    with pytest.raises(UserInputError, match=r"\(metrics.jsonl: line 2 is not a JSON object\)"):
        store.load_metrics(RUN)
    (folder / "metrics.jsonl").write_bytes(b'{"round": 1, "note": "caf\xe9"}\n')
    store_seal.write(folder, RUN)
    with pytest.raises(UserInputError, match=r"\(metrics.jsonl: not UTF-8 text\)"):
        store.load_metrics(RUN)
    np.save(folder / "membership.npy", np.zeros((2, 2)), allow_pickle=False)
    store_seal.write(folder, RUN)
    with pytest.raises(UserInputError, match=r"\(membership.npy: not a list of indices"):
        store.load_membership(RUN)
    np.save(folder / "membership.npy", np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    store_seal.write(folder, RUN)
    with pytest.raises(UserInputError, match="allow_pickle"):  # never unpickled
        store.load_membership(RUN)
    with pytest.raises(UserInputError, match=r"\(global_models.safetensors: .*round_0009"):
        store.load_tensor(RUN, "global_models", "round_0009")


def test_a_run_folder_without_its_manifest_is_not_overwritten(tmp_path):
    store = RunStore(tmp_path / "out")
    _save(store)
    (store.path(RUN) / "manifest.json").unlink()
    assert not store.is_complete(RUN)
    with pytest.raises(UserInputError, match=r"is corrupted \(manifest.json: missing\); delete that folder"):
        _save(store)
    assert sorted(p.name for p in store.path(RUN).iterdir()) == ["global_models.safetensors", "membership.npy",
                                                                 "metrics.jsonl", "model.safetensors", "seal.json"]
    assert [p.name for p in store.runs.iterdir()] == [RUN]  # no staging folder left behind


def test_a_run_that_was_never_stored_is_not_called_corrupted(tmp_path):
    store = RunStore(tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        store.load_params(RUN)


# --------------------------------------------------------------------------- through the CLI

TINY = tiny_config()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny real audit, run once: (config, output folder)."""
    base = tmp_path_factory.mktemp("tiny-store")
    config, out = base / "tiny.yaml", base / "out"
    config.write_text(TINY, encoding="utf-8")
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    return config, out


@pytest.mark.parametrize("name, damage", [("model.safetensors", _garble), ("model.safetensors", _truncate),
                                          ("manifest.json", _truncate), ("metrics.jsonl", _garble)])
def test_rerun_on_a_corrupted_store_exits_2_with_one_line(trained, tmp_path, capsys, name, damage):
    config, original = trained
    out = tmp_path / "out"
    shutil.copytree(original, out)
    results = (out / "results.json").read_bytes()
    run = sorted((out / "runs").iterdir())[-1]
    damage(run / name)
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"dpfl-audit: error: stored run '{run}' is corrupted ({name}: "), err
    assert err[0].endswith("; delete that folder and rerun the same command to retrain it"), err
    assert (out / "results.json").read_bytes() == results  # the earlier results are left as they were


def test_the_advice_works(trained, tmp_path, capsys):
    """Deleting the folder the message names and rerunning the same command retrains that run."""
    config, original = trained
    out = tmp_path / "out"
    shutil.copytree(original, out)
    run = sorted((out / "runs").iterdir())[-1]
    _garble(run / "model.safetensors")
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 2
    shutil.rmtree(run)
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    assert (out / "results.json").read_bytes() == (original / "results.json").read_bytes()
    assert (run / "model.safetensors").read_bytes() == (original / "runs" / run.name / "model.safetensors").read_bytes()

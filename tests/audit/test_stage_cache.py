"""The stage cache (audit.stage_cache): a rerun of a finished audit recomputes and rewrites nothing;
a changed attack parameter, run file, seed or code recomputes exactly what reads it; a tampered
entry or output is recomputed; the results are the same with and without the cache."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

import audit.attacking
import audit.diagnosis
import audit.pipeline
import audit.stage_cache
import audit.summary
from audit import store_seal
from audit.cli import main
from audit.core.atomic import dumps

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = ("seed: 3\ndataset: {name: digits, max_pool: 120, max_test: 60}\npartition: {clients: 4}\n"
          "training: {rounds: 2, local_steps: 1, batch_size: 10, lr: 0.1}\nmembership: {runs: 2}\n"
          "diagnostics: {sharpness_radii: [0.1], sharpness_directions: 1, perturbation_stds: [0.01], "
          "perturbation_repeats: 1, max_records: 40}\n"
          "attacks:\n  - name: loss-threshold\n  - name: record-canaries\n    params: {canaries: CANARIES}\n"
          "defenses:\n  - name: fedavg\n")
ATTACKS = {"loss-threshold", "record-canaries"}
#: files a rerun writes whatever happened: the command's own record and log
ALWAYS_WRITTEN = {"manifest.json", "run.log", ".dpfl-audit.lock"}


def _config(folder: Path, canaries: int = 20) -> Path:
    path = folder / f"tiny-{canaries}.yaml"
    path.write_text(CONFIG.replace("CANARIES", str(canaries)))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny audit (two attacks, diagnostics) and its config."""
    base = tmp_path_factory.mktemp("cached")
    config = _config(base)
    assert main(["run", str(config), "--out", str(base / "out"), "--quiet"]) == 0
    return config, base / "out"


@pytest.fixture
def copy(finished, tmp_path):
    """A copy of the finished audit to rerun (time stamps kept)."""
    config, out = finished
    shutil.copytree(out, tmp_path / "out", symlinks=True)
    return config, tmp_path / "out"


@pytest.fixture
def computed(monkeypatch):
    """What the rerun computes: attack labels, diagnosed experiments, records, pages."""
    seen: dict[str, list[str]] = {"attacks": [], "diagnostics": [], "records": [], "pages": []}
    attack, sharpness, records = audit.attacking._attack, audit.diagnosis.sharpness, audit.summary.attack_records
    figures, report = audit.pipeline.write_figures, audit.pipeline.write_report

    def counting(name, function, label=lambda *a, **k: ""):
        def wrapper(*args, **kwargs):
            seen[name].append(label(*args, **kwargs))
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(audit.attacking, "_attack", counting("attacks", attack, lambda *a, **k: a[3].label))
    monkeypatch.setattr(audit.diagnosis, "sharpness", counting("diagnostics", sharpness))
    monkeypatch.setattr(audit.summary, "attack_records", counting("records", records))
    monkeypatch.setattr(audit.pipeline, "write_figures", counting("pages", figures, lambda *a, **k: "figures"))
    monkeypatch.setattr(audit.pipeline, "write_report", counting("pages", report, lambda *a, **k: "report"))
    return seen


def _outputs(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of the output folder but the runs and the cache: (modification time, bytes)."""
    return {p.relative_to(out).as_posix(): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).parts[0] not in ("runs", "cache") and p.name not in ALWAYS_WRITTEN}


def _rerun(config: Path, out: Path, *extra: str) -> None:
    assert main(["run", str(config), "--out", str(out), "--quiet", *extra]) == 0


def test_a_rerun_recomputes_and_rewrites_nothing(copy, computed):
    config, out = copy
    before = _outputs(out)
    assert {"results.csv", "results.json", "report.html", "config.yaml"} <= set(before)
    assert any(name.startswith("attacks/") for name in before) and any(name.startswith("figures/") for name in before)
    _rerun(config, out)
    assert computed == {"attacks": [], "diagnostics": [], "records": [], "pages": []}
    assert _outputs(out) == before  # not a byte, not a time stamp changed
    assert json.loads((out / "manifest.json").read_text())["cache"]["computed"] == []


def test_changing_one_attacks_parameter_recomputes_that_attack_only(copy, computed, tmp_path):
    config, out = copy
    before = _outputs(out)
    _rerun(_config(tmp_path, canaries=30), out)
    assert computed["attacks"] == ["record-canaries"]  # trained on runs of its own: the others read nothing new
    assert computed["diagnostics"] == []
    after = _outputs(out)
    assert after["attacks/fedavg/loss-threshold.npz"] == before["attacks/fedavg/loss-threshold.npz"]
    assert after["attacks/fedavg/record-canaries.npz"] != before["attacks/fedavg/record-canaries.npz"]
    assert after["results.json"] != before["results.json"]


def _rewrite_manifest(run: Path, reseal: bool = True) -> None:
    """The same manifest in other bytes: a changed file, whatever it says; ``reseal``: sealed again
    under this machine's key, as a retrained run would be."""
    manifest = run / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=1))
    if reseal:
        store_seal.write(run, run.name)


def test_a_run_changed_behind_its_seal_is_refused_not_attacked(copy, computed, capsys):
    config, out = copy
    run = next(r for r in sorted((out / "runs").iterdir()) if "-r001-" in r.name)
    _rewrite_manifest(run, reseal=False)
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"dpfl-audit: error: stored run '{run}' is corrupted (manifest.json: changed since the run was "
                   "written); delete that folder and rerun the same command to retrain it"]
    assert computed["attacks"] == [] and computed["diagnostics"] == []


def test_a_forged_entry_with_its_digest_recomputed_is_not_reported(copy, computed):
    """An attacker who can write in --out edits an attack's AUC and recomputes the SHA-256 an
    editor could: the rerun recomputes the attack and reports the real value."""
    config, out = copy
    results = (out / "results.json").read_bytes()
    entry = out / "cache" / "attacks" / "fedavg" / "loss-threshold.json"
    forged = json.loads(entry.read_text())
    forged["value"]["results"][0]["fields"]["metrics"]["auc"]["fields"]["value"] = 0.123456789
    body = {name: forged[name] for name in ("key", "outputs", "reads", "value")}
    forged["seal"] = hashlib.sha256(dumps(body, indent=None).encode()).hexdigest()
    entry.write_text(json.dumps(forged))
    _rerun(config, out)
    assert computed["attacks"] == ["loss-threshold"]
    assert (out / "results.json").read_bytes() == results and b"0.123456789" not in entry.read_bytes()
    assert "0.123456789" not in (out / "results.csv").read_text()


def test_a_changed_run_file_recomputes_what_reads_it(copy, computed):
    config, out = copy
    runs = sorted((out / "runs").iterdir())
    canary_run = next(r for r in runs if "-record-canaries-" in r.name)
    _rewrite_manifest(canary_run)
    _rerun(config, out)
    assert computed["attacks"] == ["record-canaries"] and computed["diagnostics"] == []
    computed["attacks"].clear()
    _rewrite_manifest(next(r for r in runs if "-r001-" in r.name))  # a membership run: everything reads it
    _rerun(config, out)
    assert set(computed["attacks"]) == ATTACKS and len(computed["diagnostics"]) == 2  # one call per run


def test_another_seed_recomputes_everything(copy, computed):
    config, out = copy
    _rerun(config, out, "--seed", "4")
    assert set(computed["attacks"]) == ATTACKS and computed["diagnostics"] and sorted(computed["pages"]) == ["figures", "report"]


def test_a_code_change_invalidates_every_entry(copy, computed, monkeypatch):
    config, out = copy
    monkeypatch.setattr(audit.stage_cache, "code_version", lambda: "another version")
    _rerun(config, out)
    assert set(computed["attacks"]) == ATTACKS and computed["diagnostics"] and computed["records"]
    assert sorted(computed["pages"]) == ["figures", "report"]


def test_source_digest_follows_every_file_but_compiled_caches(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    digest = audit.stage_cache.source_digest({"pkg": tmp_path / "pkg"})
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    assert audit.stage_cache.source_digest({"pkg": tmp_path / "pkg"}) == digest
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    changed = audit.stage_cache.source_digest({"pkg": tmp_path / "pkg"})
    (tmp_path / "pkg" / "template.html").write_text("<p>")
    assert len({digest, changed, audit.stage_cache.source_digest({"pkg": tmp_path / "pkg"})}) == 3


def test_a_tampered_entry_or_output_is_recomputed(copy, computed):
    config, out = copy
    results = (out / "results.json").read_bytes()
    entry = out / "cache" / "attacks" / "fedavg" / "loss-threshold.json"
    text = entry.read_text()
    tampered = json.loads(text)
    tampered["value"]["results"][0]["fields"]["notes"] = "tampered"  # its digest no longer matches
    entry.write_text(json.dumps(tampered))
    (out / "report.html").write_text("tampered")
    _rerun(config, out)
    assert computed["attacks"] == ["loss-threshold"] and computed["pages"] == ["report"]
    assert (out / "results.json").read_bytes() == results
    assert "tampered" not in (out / "report.html").read_text() and entry.read_text() == text


def test_results_are_the_same_with_and_without_the_cache(finished, tmp_path, computed):
    config, out = finished
    fresh = tmp_path / "fresh"
    shutil.copytree(out, fresh, ignore=shutil.ignore_patterns("cache", "attacks", "diagnostics", "figures", "results.*",
                                                              "report.html"))
    _rerun(config, fresh, "--no-cache")
    assert set(computed["attacks"]) == ATTACKS and not (fresh / "cache" / "attacks").exists()
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    (partial / "cache" / "attacks" / "fedavg" / "loss-threshold.json").unlink()  # one attack recomputed, the other read back
    _rerun(config, partial)
    for name in ("results.csv", "results.json", "report.html"):
        assert (fresh / name).read_bytes() == (out / name).read_bytes() == (partial / name).read_bytes(), name


def test_the_tutorial_shows_the_cache_commands_this_parser_takes():
    from audit.cli_parser import build_parser
    from tests.helpers import DOCS, readme_commands

    commands = [c for c in readme_commands("dpfl-audit run", DOCS / "tutorial" / "first-audit.md") if "smoke-out" in c]
    parsed = [build_parser().parse_args(["run", *c]) for c in commands]
    assert [p.no_cache for p in parsed] == [False, False, True] and {p.out for p in parsed} == {"smoke-out"}


def test_a_run_attack_is_recomputed_when_a_side_run_it_read_changed(tmp_path, computed):
    config = tmp_path / "side.yaml"  # attribute inference on digits reads a side run trained on diabetes
    config.write_text(CONFIG.split("attacks:")[0].replace("diagnostics: {", "diagnostics: {enabled: false, ")
                      + "attacks:\n  - name: attribute-inference\ndefenses:\n  - name: fedavg\n")
    out = tmp_path / "out"
    _rerun(config, out)
    (side,) = (out / "runs").glob("fedavg-side-*")
    computed["attacks"].clear()
    _rerun(config, out)
    assert computed["attacks"] == []
    _rewrite_manifest(side)
    _rerun(config, out)
    assert computed["attacks"] == ["attribute-inference"]


@pytest.mark.parametrize("depth", [900, 5000])
def test_an_entry_nested_too_deeply_is_recomputed_not_an_error(copy, computed, depth):
    config, out = copy
    results = (out / "results.json").read_bytes()
    entry = out / "cache" / "attacks" / "fedavg" / "loss-threshold.json"
    document = json.loads(entry.read_text())
    text = json.dumps(document).replace('"value": {', '"value": ' + "[" * depth + "]" * depth + ', "was": {', 1)
    entry.write_text(text)
    _rerun(config, out)
    assert computed["attacks"] == ["loss-threshold"] and (out / "results.json").read_bytes() == results

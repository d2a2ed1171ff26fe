"""Bounded input: YAML aliases, and sizes refused before any
allocation or work. Each case runs the command line and checks the exit code 2, the single line on
stderr, and that nothing was written — no --out folder, no file anywhere under the test's folder.
(Score files: tests/audit/test_score_files.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from audit.cli import main
from tests.helpers import tiny_config

#: a config whose attack is set by each case; nothing here trains (every case is refused first)
BASE = tiny_config()


def files_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


def run_cli(capsys, tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    """Run the command line in ``tmp_path``; (exit code, stderr lines)."""
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err.splitlines()


# --------------------------------------------------------------------------- YAML anchors and aliases

#: "billion laughs": each line multiplies the one before by nine (here only 9³ strings, but the
#: same three lines with a few more levels reach gigabytes)
LAUGHS = """  options:
    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]
"""

REFUSED = "are not allowed; allowed: plain YAML, every value written out in full"


@pytest.mark.parametrize("text, words", [
    # a billion-laughs structure under dataset.options
    ("name: tiny\ndataset:\n  name: digits\n" + LAUGHS, ["line 5:", "YAML anchors (&a) and aliases (*a)"]),
    # under a defense's params
    ("name: tiny\nx: &p {clip: 1.0}\ndefenses: [{name: dp-fedavg, params: *p}]\n", ["line 2:", "anchors (&p)"]),
    # a scalar alias, its anchor never given
    ("name: tiny\nseed: *s\n", ["line 2:", "YAML aliases (*s)"]),
    # recursive: the alias sits inside its own anchor (a cycle)
    ("name: tiny\nseed: &s [*s]\n", ["line 2:", "anchors (&s)"]),
    ("name: &n {a: *n}\n", ["line 1:", "anchors (&n)"]),
    # a merge key is an alias too
    ("base: &b {rounds: 1}\ntraining:\n  <<: *b\n", ["line 1:", "anchors (&b)"]),
])
def test_yaml_anchors_and_aliases_in_a_config_are_one_line(tmp_path, capsys, text, words):
    config = tmp_path / "aliases.yaml"
    config.write_text(text, encoding="utf-8")
    code, err = run_cli(capsys, tmp_path, "run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"dpfl-audit: error: {config}: line ") and REFUSED in err[0], err
    assert all(word in err[0] for word in words), err
    assert files_under(tmp_path) == {config}


@pytest.mark.parametrize("args, words", [
    (["config", "{config}", "--set", "seed=&a [*a]"], ["--set seed: line 1:", "anchors (&a)"]),
    (["config", "{config}", "--set", "dataset.options={x: *a}"], ["--set dataset.options: line 1:", "aliases (*a)"]),
    (["sweep", "{config}", "--over", "seed=&a [1],*a", "--out", "{out}"], ["--over seed: line 1:", "anchors (&a)"]),
    (["conformance", "dp-fedavg", "--param", "noise_multiplier=*z"],
     ["--param: the value of 'noise_multiplier' is not valid YAML: line 1:", "aliases (*z)"]),
    (["check", "{folder}", "--policy", "{policy}"], ["--policy:", "line 1:", "anchors (&e)"]),
])
def test_yaml_aliases_on_the_command_line_and_in_policies_are_one_line(tmp_path, capsys, args, words):
    config, policy, out = tmp_path / "c.yaml", tmp_path / "policy.yaml", tmp_path / "out"
    config.write_text(BASE, encoding="utf-8")
    policy.write_text("experiment: &e {name: fedavg}\nrules: [*e]\n", encoding="utf-8")
    (tmp_path / "results").mkdir()
    before = files_under(tmp_path)
    places = {"{config}": config, "{out}": out, "{policy}": policy, "{folder}": tmp_path / "results"}
    filled = [str(places.get(a, a)) for a in args]
    code, err = run_cli(capsys, tmp_path, *filled)
    assert code == 2 and len(err) == 1 and REFUSED in err[0], err
    assert all(word in err[0] for word in words), err
    assert files_under(tmp_path) == before


def test_a_yaml_file_beyond_the_size_limit_is_refused_before_reading(tmp_path, capsys, monkeypatch):
    import audit.core.strict_yaml as strict_yaml

    monkeypatch.setattr(strict_yaml, "MAX_YAML_BYTES", 64)
    config = tmp_path / "big.yaml"
    config.write_text(BASE, encoding="utf-8")
    code, err = run_cli(capsys, tmp_path, "run", str(config), "--out", str(tmp_path / "out"))
    assert code == 2 and len(err) == 1, err
    assert f"{config}: the file has {len(BASE.encode())} bytes" in err[0] and "allowed: up to 64 bytes" in err[0]
    assert files_under(tmp_path) == {config}


# --------------------------------------------------------------------------- sizes before work


@pytest.mark.parametrize("attack, words", [
    ({"name": "record-canaries", "params": {"canaries": 1_000_000}},
     ["attacks[0].params.canaries", "must be <= 50000", "1000000"]),
    ({"name": "client-canaries", "params": {"canaries": 1_000_000}},
     ["attacks[0].params.canaries", "must be <= 10000", "1000000"]),
])
def test_canary_counts_are_bounded_before_the_output_folder_exists(tmp_path, capsys, attack, words):
    config = tmp_path / "canaries.yaml"
    config.write_text(tiny_config(attacks=[attack]), encoding="utf-8")
    code, err = run_cli(capsys, tmp_path, "run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert code == 2 and len(err) == 1 and all(word in err[0] for word in words), err
    assert files_under(tmp_path) == {config}


def test_canary_directions_beyond_the_machines_memory_are_refused_in_planning(tmp_path, capsys, monkeypatch):
    # 10,000 canary clients on a 64-2000-2000-10 MLP: every run's directions are 10⁴ × 4,152,010
    # float32 numbers (166 GB a run), refused against a machine of 8 GiB before anything trains
    import audit.budget

    monkeypatch.setattr(audit.budget, "_total_memory", lambda: 8.0 * 2**30)
    config = tmp_path / "big.yaml"
    config.write_text(tiny_config(model={"name": "mlp", "options": {"hidden": [2000, 2000]}},
                                  defenses=[{"name": "dp-fedavg", "epsilons": [4]}],
                                  attacks=[{"name": "client-canaries", "params": {"canaries": 10_000}}]), encoding="utf-8")
    code, err = run_cli(capsys, tmp_path, "run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert code == 2 and len(err) == 1, err
    assert "attack 'client-canaries'" in err[0] and "4152010 model parameters" in err[0] and "allowed:" in err[0], err
    assert files_under(tmp_path) == {config}


@pytest.mark.parametrize("flags", [
    ["--trials", "10000000", "--dim", "1000000"],
    ["--trials", "100000", "--dim", "100000", "--canary", "spread"],
    ["--trials", "10001", "--dim", "100000"],
])
def test_audit_mechanism_bounds_trials_times_dim_before_sampling(tmp_path, capsys, monkeypatch, flags):
    monkeypatch.chdir(tmp_path)
    started = time.perf_counter()
    code, err = run_cli(capsys, tmp_path, "audit-mechanism", "--mechanism", "gaussian", "--noise", "1", *flags)
    assert time.perf_counter() - started < 2.0
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("dpfl-audit: error: --trials × --dim: ") and "allowed: --trials × --dim up to 1e+09" in err[0]
    assert not any(tmp_path.iterdir())


def test_audit_mechanism_with_the_concentrated_canary_draws_one_coordinate(capsys):
    """Only the spread canary draws every coordinate: a large --dim with --canary concentrated is allowed."""
    code, err = run_cli(capsys, Path("."), "audit-mechanism", "--mechanism", "gaussian", "--noise", "1",
                        "--trials", "2000", "--dim", "1000000", "--canary", "concentrated", "--json")
    assert code == 0 and err == []


def test_sweep_grid_limit_comes_before_parsing_every_axis(tmp_path, capsys):
    """10 axes × 5,000 values: refused once the first axis is parsed, not after all ten and a
    quadratic search for repeated values."""
    config = tmp_path / "c.yaml"
    config.write_text(BASE, encoding="utf-8")
    values = ",".join(str(i) for i in range(5000))
    overs = [arg for i in range(10) for arg in ("--over", f"dataset.options.k{i}={values}")]
    started = time.perf_counter()
    code, err = run_cli(capsys, tmp_path, "sweep", str(config), *overs, "--out", str(tmp_path / "out"))
    assert time.perf_counter() - started < 2.0
    assert code == 2 and len(err) == 1, err
    assert "--over: the grid has at least 5000 points, more than the 256" in err[0] and "allowed: up to 256" in err[0]
    assert files_under(tmp_path) == {config}


def test_sweep_values_beyond_the_length_limit_are_refused_before_parsing(tmp_path, capsys):
    from audit.sweep import MAX_OVER_CHARS

    config = tmp_path / "c.yaml"
    config.write_text(BASE, encoding="utf-8")
    values = ",".join(str(i) for i in range(20000))
    code, err = run_cli(capsys, tmp_path, "sweep", str(config), "--over", f"seed={values}", "--out", str(tmp_path / "out"))
    assert code == 2 and len(err) == 1, err
    assert f"--over seed: the values are {len(values)} characters long; allowed: up to {MAX_OVER_CHARS}" in err[0]
    assert files_under(tmp_path) == {config}


def test_sweep_repeated_values_are_found_in_one_pass():
    """A repeated value is still refused (the first one repeated), and the check is linear: 20,000
    distinct values of one axis take well under a second (the old count() per value took seconds)."""
    from audit.core.errors import UserInputError
    from audit.sweep import Axis, _check_distinct

    with pytest.raises(UserInputError, match=r"--over seed: value 3 is given twice$"):
        _check_distinct(Axis("seed", (1, 3, 2, 3, 1)))
    started = time.perf_counter()
    _check_distinct(Axis("seed", tuple(range(20000))))
    assert time.perf_counter() - started < 1.0

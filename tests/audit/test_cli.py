"""The command line through a real subprocess: exit codes, one-line errors, JSON outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "audit", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_epsilon_reference_values():
    improved = json.loads(cli("epsilon", "--noise", "1.5", "--rate", "0.04", "--steps", "2250", "--delta",
                              "1e-5", "--json").stdout)
    assert improved["epsilon"] == pytest.approx(7.33, abs=0.005) and improved["conversion"] == "improved"
    assert "dp-accounting" in improved["label"]
    classic = json.loads(cli("epsilon", "--conversion", "classic", "--noise", "1.5406", "--rate", "0.0166666667",
                             "--steps", "200", "--delta", "1e-5", "--json").stdout)
    assert classic["epsilon"] == pytest.approx(1.000, abs=0.005)


def test_epsilon_calibration_round_trip():
    calibrated = json.loads(cli("epsilon", "--target-epsilon", "3", "--rate", "0.01", "--steps", "1000", "--delta",
                                "1e-5", "--json").stdout)
    assert "noise" in calibrated and calibrated["epsilon"] <= 3.0
    again = json.loads(cli("epsilon", "--noise", repr(calibrated["noise"]), "--rate", "0.01", "--steps", "1000", "--delta",
                           "1e-5", "--json").stdout)
    assert again["epsilon"] == pytest.approx(3.0, rel=1e-3) and again["epsilon"] <= 3.0


def test_list_json_names_everything():
    listing = json.loads(cli("list", "--json").stdout)
    assert {"digits", "lfw-faces", "diabetes", "mnist", "fashion-mnist", "emnist", "cifar10", "cifar100",
            "adult"} <= set(listing["datasets"])
    assert {"mlp", "cnn2", "cnn-mcmahan", "cnn-fedsam", "lenet", "resnet18-gn"} <= set(listing["models"])
    assert {"fedavg", "dp-fedavg", "dp-fedavg-blur", "dp-fedavg-lus", "dp-fedavg-blur-lus", "ddgauss", "ae-dpfl",
            "fedsam", "dp-fedsam", "dp-fedsam-topk", "fed-smp-randk", "fed-smp-topk", "udp-fl", "nbafl", "fl-top",
            "fl-top-dp", "fl-basic", "fl-basic-dp", "fl-std", "fl-std-dp", "fl-cs", "fl-cs-dp",
            "ldp-fl"} <= set(listing["defenses"])
    assert "lira" in listing["attacks"] and "smoke" in listing["presets"]
    assert listing["details"]["defenses"]["dp-fedavg"]["params"]["clip"]["default"] == 1.0
    # the claim per observer at the default audit's settings: labelled, with its relation
    claim = listing["details"]["defenses"]["dp-fedavg"]["claim_at_defaults"]
    assert claim["headline"] == "released" and set(claim["adversaries"]) == {"released", "server", "local"}
    released, server = claim["adversaries"]["released"], claim["adversaries"]["server"]
    # DP-FedAvg divides by the realized number of participants (the paper's choice): zero-out neighbours
    assert released["relation"] == "zero-out" and server["relation"] == "zero-out" and not server["amplification"]
    assert server["epsilon"] > released["epsilon"]  # no secure aggregation: the server sees each upload
    assert listing["details"]["defenses"]["ddgauss"]["claim_at_defaults"]["adversaries"]["local"]["epsilon"] is None
    assert listing["details"]["defenses"]["fedavg"]["claim_at_defaults"]["headline"] is None


def test_config_typo_exits_2_with_one_line_and_writes_nothing(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text("dataset: {name: digits}\ntraning: {rounds: 3}\n")
    out = tmp_path / "out"
    result = cli("run", str(config), "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "traning: unknown field; allowed:" in lines[0] and "training" in lines[0]
    assert not out.exists()


def test_bad_arguments_exit_2_with_one_line(tmp_path):
    result = cli("epsilon", "--noise", "1", "--rate", "2", "--steps", "10", "--delta", "1e-5")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "rate" in result.stderr
    result = cli("run", "--bogus")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    result = cli("run", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "does not exist" in result.stderr and not (tmp_path / "o").exists()


def test_version():
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("dpfl-audit ")

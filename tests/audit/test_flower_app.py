"""The Flower example as a Flower App (examples/flower/pyproject.toml), run the way Flower 1.42
recommends instead of the deprecated ``run_simulation``: ``flwr run examples/flower`` on a local
simulation SuperLink. One run, the smallest that decides (2 rounds, Flower secretly adding σ = 0.01
while the claim is computed from σ = 10): the canary Mod runs in Flower's own client processes,
the audit in the ServerApp, and the results say VIOLATION. The SuperLink runs with runtime
dependency installation disabled, so the app uses this environment (Flower would otherwise
install the app's dependencies from a package index with uv)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLAIM_SIGMA, SAMPLE, POPULATION, ROUNDS, DELTA = 10.0, 100, 204, 2, 1e-5


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture()
def superlink(tmp_path):
    """A local simulation SuperLink of our own (its own Flower home and ports), stopped afterwards."""
    if not (BIN / "flwr").exists() or not (BIN / "flower-superlink").exists():
        pytest.skip("Flower's command-line tools are not installed in this environment")
    http, control = _free_port(), _free_port()
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
           "FLWR_LOCAL_CONTROL_API_PORT": str(control), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = (tmp_path / "superlink.log").open("w")
    process = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
         "--control-api-address", f"127.0.0.1:{control}", "--host", "127.0.0.1", "--port", str(http),
         "--disable-runtime-dependency-installation"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _healthy(http):
            assert process.poll() is None, (tmp_path / "superlink.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the SuperLink did not start in 120 s"
            time.sleep(0.5)
        yield env
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the SuperLink and the simulation processes it started
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_flwr_run_audits_the_flower_app_and_finds_the_lowered_noise(superlink, tmp_path):
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    out = tmp_path / "lowered"
    command = [str(BIN / "flwr"), "run", str(ROOT / "examples" / "flower"), "--stream",
               "--federation-config", f"num-supernodes={POPULATION}",
               "--run-config", f"rounds={ROUNDS} noise-multiplier=0.01 claimed-noise-multiplier={CLAIM_SIGMA} out='{out}'"]
    result = subprocess.run(command, env=superlink, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verdict: violation" in result.stdout

    (experiment,) = json.loads((out / "results.json").read_text())["experiments"]
    assert experiment["soundness"] == "violation"
    # the claim: dp-accounting for Flower's m of N without replacement, σ = 10, two rounds
    accountant = rdp_privacy_accountant.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        POPULATION, SAMPLE, dp_accounting.GaussianDpEvent(CLAIM_SIGMA / 2)), ROUNDS)
    assert experiment["claim"]["epsilon"] == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-9)
    bounds = [a["metrics"][m]["value"] for a in experiment["attacks"] for m, kind in a["epsilon_kind"].items()
              if kind == "lower_bound"]
    assert max(bounds) > experiment["claim"]["epsilon"]
    assert (out / "report.html").is_file() and (out / "flower_view.npz").is_file()


def test_the_app_refuses_a_relative_output_folder_and_unknown_settings(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "flower"))
    monkeypatch.delitem(sys.modules, "app", raising=False)
    import app

    from audit.core.errors import UserInputError

    assert app.settings({}).out is None and app.settings({}).claimed_noise_multiplier is None
    parsed = app.settings({"rounds": 2, "claimed-noise-multiplier": 10.0, "out": "/tmp/x"})
    assert (parsed.rounds, parsed.claimed_noise_multiplier, parsed.out) == (2, 10.0, "/tmp/x")
    with pytest.raises(UserInputError, match="^out: 'flower-audit' is not allowed; allowed: an absolute path"):
        app.settings({"out": "flower-audit"})
    with pytest.raises(UserInputError, match="^run config: unknown key"):
        app.settings({"roundz": 2})


def test_the_documented_flwr_run_commands_are_the_ones_tested_here():
    """The how-to page shows ``flwr run`` with the settings this file runs (population, run config keys)."""
    page = (ROOT / "docs" / "how-to" / "own-system.md").read_text(encoding="utf-8")
    lines = [line for line in page.splitlines() if line.startswith("flwr run examples/flower")]
    assert len(lines) == 2, lines
    for line in lines:
        assert f'--federation-config "num-supernodes={POPULATION}"' in line and "--stream" in line
    assert "noise-multiplier=0.01" in lines[1] and f"claimed-noise-multiplier={CLAIM_SIGMA}" in lines[1]

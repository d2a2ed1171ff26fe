"""The white-box gradient-canary audit of DP-SGD with Opacus (audit.gradient_canary_audit)
through examples/opacus_audit.py's own training function: a planted noise bug is a VIOLATION, honest
DP-SGD is not, the same seed gives the same audit, bad input is one line."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from audit.core.errors import UserInputError
from audit.external import stated_claim
from audit.gradient_canary_audit import gradient_canary_audit
from audit.own_training import dataset_pool
from tests.helpers import DOCS, load_script, readme_commands, with_out

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is the fastest

pytest.importorskip("opacus")

ROOT = Path(__file__).resolve().parents[2]
#: a small design: σ = 2 (claim ε = 1.40 at q = 1/16, T = 80, δ = 1e-5), 2,000 coins in one run, 96 records
SIGMA, EPOCHS, POOL, COINS = 2.0, 5, 96, 2000



@pytest.fixture(scope="module")
def example():
    return load_script(ROOT / "examples" / "opacus_audit.py", "opacus_audit_example")


@pytest.fixture(scope="module")
def pool():
    return dataset_pool("digits", POOL, 0)[1]


def _audit(example, pool, noise_bug: float, seed: int = 0):
    claim = stated_claim(example.claimed_epsilon(SIGMA, EPOCHS), 1e-5, "record", accountant="opacus RDP accountant")
    train = example.make_train(SIGMA, EPOCHS, noise_bug=noise_bug)
    return claim, gradient_canary_audit(train, pool.features, pool.labels, claim, noise_multiplier=SIGMA,
                                        sample_rate=example.SAMPLE_RATE, coins=COINS, seed=seed, progress=False)


def test_a_tenth_of_the_claimed_noise_is_a_violation(example, pool):
    """The optimiser adds 0.1·σ noise while the claim (and Opacus's own accountant, checked inside
    train) keep σ: the canaries' readings stand out, the one-run bound exceeds the claim after Holm."""
    claim, audit = _audit(example, pool, noise_bug=0.1)
    assert audit.runs == 1 and audit.scores.size == COINS and audit.steps == example.steps(EPOCHS)
    assert audit.status == "violation", audit.sentence
    assert audit.epsilon_lower_bound > claim.epsilon
    assert audit.held_out_spread < 0.2  # the held-out readings carry a tenth of the claimed noise


def test_honest_dp_sgd_is_not_a_violation_and_the_same_seed_gives_the_same_audit(example, pool):
    claim, audit = _audit(example, pool, noise_bug=1.0)
    assert audit.status != "violation", audit.sentence
    assert audit.epsilon_lower_bound <= claim.epsilon
    assert 0.95 < audit.held_out_spread < 1.1  # noise as claimed, plus the records' small share
    assert audit.power is not None and audit.power.canaries == COINS
    statistic = audit.results.experiments[0].attacks[0].statistic
    assert statistic is not None and "mixture log-likelihood ratio" in statistic
    _, again = _audit(example, pool, noise_bug=1.0)
    assert np.array_equal(audit.scores, again.scores) and np.array_equal(audit.inserted, again.inserted)


def test_the_documented_command_plants_the_bug_and_catches_it(example, tmp_path):
    """The --noise-bug 0.1 command of docs/how-to/own-system.md, as printed (2×10⁴ coins over 5 runs of 80 steps)."""
    commands = readme_commands("python examples/opacus_audit.py", DOCS / "how-to" / "own-system.md")
    (arguments,) = [a for a in commands if "--noise-bug" in a]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert example.main([*with_out(arguments, tmp_path / "out"), "--quiet"]) == 0
    text = printed.getvalue()
    assert "planted bug" in text and "verdict: violation" in text, text
    assert (tmp_path / "out" / "results.json").exists()


def test_bad_input_is_one_line_naming_the_field(example, pool):
    claim = stated_claim(1.0, 1e-5, "record")
    train = example.make_train(SIGMA, 1)

    def no_attach(features, labels, seed):
        return torch.nn.Linear(64, 10)

    cases = [(dict(coins=1), "coins"), (dict(sample_rate=0.0), "sample_rate"), (dict(noise_multiplier=0.0), "noise_multiplier"),
             (dict(amplitude=0.5), "amplitude"), (dict(train=no_attach), "train"),
             (dict(claim=stated_claim(1.0, 1e-5, "client")), "claim unit")]
    for change, field in cases:
        arguments = dict(train=train, claim=claim, noise_multiplier=SIGMA, sample_rate=1 / 16, coins=COINS, progress=False)
        arguments.update(change)
        with pytest.raises(UserInputError, match=field) as error:
            gradient_canary_audit(arguments.pop("train"), pool.features, pool.labels, arguments.pop("claim"), **arguments)
        assert "\n" not in str(error.value)

"""Bring-your-own training: a user's train(features, labels, seed) driven through
membership runs and a one-run canary audit (audit.own_training), the Opacus example end to end,
and the ``audit-training`` command."""

from __future__ import annotations

import contextlib
import html
import io
import json
import math
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from audit.cli import main
from audit.core.errors import UserInputError
from audit.external import stated_claim
from audit.own_training import audit_training, dataset_pool
from defenses.privacy.accounting import GaussianSchedule, compute_epsilon
from reports.results import load_results
from tests.helpers import DOCS, load_script, readme_commands, with_out

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is the fastest

ROOT = Path(__file__).resolve().parents[2]
POOL = 400  # records of the candidate pool (digits, stratified)

#: a non-private training function: full-batch Adam until the records are memorised (no clipping, no noise)
MEMORISING = textwrap.dedent('''
    import torch
    from torch import nn


    def train(features, labels, seed):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(200):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(features), labels).backward()
            optimizer.step()
        return model
''')


def _memorising(tmp_path: Path):
    script = tmp_path / "memorising.py"
    script.write_text(MEMORISING, encoding="utf-8")
    namespace: dict = {}
    exec(compile(MEMORISING, str(script), "exec"), namespace)  # our own test source, not a user file
    return script, namespace["train"]



@pytest.fixture(scope="module")
def split():
    _, pool, test = dataset_pool("digits", POOL, 0)
    return pool, test


@pytest.fixture(scope="module")
def opacus_run(tmp_path_factory):
    """examples/opacus_audit.py run by the command of docs/how-to/own-system.md, small: 4 membership models and a
    canary run of 5 DP-SGD epochs (σ = 1, q = 1/16, T = 80), 100 canaries."""
    pytest.importorskip("opacus")
    example = load_script(ROOT / "examples" / "opacus_audit.py", "opacus_audit_example")
    out = tmp_path_factory.mktemp("opacus") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        # the page's command (docs/how-to/own-system.md), as printed there; the gradient-canary commands
        # beside it are tests/audit/test_gradient_canary_audit.py's
        (arguments,) = [a for a in readme_commands("python examples/opacus_audit.py", DOCS / "how-to" / "own-system.md")
                        if "--gradient-canaries" not in a]
        assert arguments[arguments.index("--pool") + 1] == str(POOL)
        assert example.main(with_out(arguments, out)) == 0
    return example, out, printed.getvalue()


def test_the_opacus_claim_is_its_accountants_and_agrees_with_dp_accounting(opacus_run):
    """The claim in results.json is what Opacus's RDP accountant gives for (σ = 1, q = 1/16, T = 80,
    δ = 1e-5) — each run's train() checked that its engine spent exactly that — and dp-accounting's
    RDP accountant, an independent implementation with another grid of orders, agrees to 0.1 %."""
    from opacus.accountants import RDPAccountant

    example, out, printed = opacus_run
    accountant = RDPAccountant()
    accountant.history = [(1.0, 1 / 16, 80)]
    opacus_epsilon = accountant.get_epsilon(1e-5)
    document = json.loads((out / "results.json").read_text(encoding="utf-8"))
    claim = document["experiments"][0]["claim"]
    assert claim["epsilon"] == pytest.approx(opacus_epsilon, rel=1e-12) and claim["unit"] == "record"
    assert claim["delta"] == 1e-5 and "opacus" in claim["accountant"]
    ours = compute_epsilon(GaussianSchedule(1.0, 1 / 16, 80), 1e-5).epsilon
    assert opacus_epsilon == pytest.approx(ours, rel=1e-3)
    assert f"{opacus_epsilon:.3f}" in printed


def test_honest_dp_sgd_is_not_a_violation_and_the_report_says_what_was_audited(opacus_run):
    _, out, printed = opacus_run
    results, _, _ = load_results(out)  # the schema holds
    experiment = results.experiments[0]
    assert experiment.soundness != "violation", experiment.soundness_text
    attacks = {a.attack: a for a in experiment.attacks}
    assert set(attacks) == {"lira-online", "lira-offline", "rmia-online", "rmia-offline", "record-canaries"}
    canaries = attacks["record-canaries"]
    assert canaries.kind == "canary" and {"epsilon_one_run", "epsilon_one_run_fdp"} <= set(canaries.metrics)
    for record in experiment.attacks:  # 95 % lower bounds of an honest (ε = 4.57)-DP mechanism stay below it
        for metric in ("epsilon_one_run", "epsilon_one_run_fdp"):
            assert record.metrics[metric].value <= experiment.claim.epsilon, (record.attack, metric)
    assert 0.3 < experiment.utility.test_accuracy.value <= 1.0  # ten classes: chance is 0.1
    assert results.audit.membership_runs == 4 and results.audit.pool_size == POOL
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "opacus-dp-sgd" in report and results.audit.system in html.unescape(report)
    assert "verdict:" in printed and "epsilon_one_run" in printed


def test_a_memorising_model_violates_a_small_claim_through_the_command_line(tmp_path):
    """Leaky: plain full-batch Adam memorises the mislabelled canaries it sees — the inserted ones get
    their (wrong) label, the others not — so the canary ranking is near perfect and the one-run
    bound exceeds a stated ε = 0.5: the verdict is a violation. Through the CLI, exit 0."""
    script, _ = _memorising(tmp_path)
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["audit-training", f"{script}:train", "--dataset", "digits", "--pool", "300", "--models", "4",
                     "--canaries", "100", "--claim-epsilon", "0.5", "--delta", "1e-5", "--out", str(out), "--quiet"])
    assert code == 0
    results, manifest, _ = load_results(out)
    experiment = results.experiments[0]
    assert experiment.claim.epsilon == 0.5 and manifest["audited"] == results.audit.system
    canaries = next(a for a in experiment.attacks if a.attack == "record-canaries")
    assert canaries.metrics["auc"].value > 0.95  # memorised
    assert canaries.metrics["epsilon_one_run"].value > 1.0 and canaries.metrics["epsilon_one_run_fdp"].value > 1.0
    assert experiment.soundness == "violation"
    assert {"results.json", "results.csv", "report.html", "manifest.json"} <= {p.name for p in out.iterdir()}


def test_the_design_the_training_function_sees(split):
    """What train() is handed: membership run r gets the pool records whose coin is on (a subset, about
    half: binomial, 5 σ), the canary run the whole pool in order plus the inserted canaries, which are
    copies of test records with a label other than the record's own; every call its own seed."""
    pool, test = split
    calls = []

    def train(features, labels, seed):
        calls.append((features.clone(), labels.clone(), seed))
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))  # an untrained model is still a model

    m = 200
    audit_training(train, pool.features, pool.labels, stated_claim(1.0, 1e-5, "record"), models=3, canaries=m,
                   attacks=["rmia"], test=(test.features, test.labels), progress=False)
    assert len(calls) == 4 and len({seed for *_, seed in calls}) == 4
    rows = {tuple(x.flatten().tolist()): int(y) for x, y in zip(pool.features, pool.labels)}
    n = len(pool.labels)
    for features, labels, _ in calls[:3]:
        assert all(rows.get(tuple(x.flatten().tolist())) == int(y) for x, y in zip(features, labels))
        assert abs(len(labels) - n / 2) < 5 * math.sqrt(n / 4)
    features, labels, _ = calls[3]
    assert torch.equal(features[:n], pool.features) and torch.equal(labels[:n], pool.labels)
    inserted = len(labels) - n
    assert abs(inserted - m / 2) < 5 * math.sqrt(m / 4)
    held_out = {}
    for x, y in zip(test.features, test.labels):
        held_out.setdefault(tuple(x.flatten().tolist()), set()).add(int(y))
    for x, y in zip(features[n:], labels[n:]):
        true_labels = held_out[tuple(x.flatten().tolist())]
        assert int(y) not in true_labels


def test_the_same_seed_gives_the_same_results(split, tmp_path):
    pool, test = split
    _, train = _memorising(tmp_path)
    claim = stated_claim(1.0, 1e-5, "record")

    def figures(seed):
        document = audit_training(train, pool.features[:200], pool.labels[:200], claim, models=2, canaries=20,
                                  attacks=["rmia"], test=(test.features, test.labels), seed=seed, progress=False)
        return [(r.attack, r.metric, r.value) for r in document.rows]

    first = figures(3)
    assert first == figures(3)
    assert first != figures(4)


@pytest.mark.parametrize("change, field", [
    ({"train": lambda x, y, seed: "a model"}, r"^train: must return the trained torch\.nn\.Module, got str"),
    ({"train": lambda x, y, seed: 1 / 0}, r"^train: raised ZeroDivisionError on membership model 0"),
    ({"claim": stated_claim(1.0, 1e-5, "client")}, r"^claim unit: 'client' is not allowed; allowed: record"),
    ({"claim": {"epsilon": 1.0}}, r"^claim: must be a PrivacyClaim"),
    ({"models": 1}, r"^models: must be an integer in 2\.\.4096, got 1"),
    ({"models": 3, "attacks": ["lira"]}, r"^models: lira needs at least 4 models, got 3"),
    ({"canaries": 2}, r"^canaries: must be an integer in 0 or 4\.\."),
    ({"attacks": ["record-canaries"]}, r"^attacks\[0\]\.name: 'record-canaries' is not a membership attack"),
    ({"labels": "y"}, r"^features: features and labels must be torch tensors"),
    ({"test": (torch.zeros(5, 3), torch.zeros(5, dtype=torch.int64))}, r"^test: features of shape \(3,\) per record"),
])
def test_bad_input_is_a_one_line_error_naming_the_field(split, change, field):
    pool, _ = split

    def train(features, labels, seed):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    arguments = {"train": train, "features": pool.features[:40], "labels": pool.labels[:40],
                 "claim": stated_claim(1.0, 1e-5, "record"), "models": 2, "canaries": 0, "attacks": ["rmia"],
                 "progress": False, **change}
    positional = [arguments.pop(k) for k in ("train", "features", "labels", "claim")]
    with pytest.raises(UserInputError, match=field) as caught:
        audit_training(*positional, **arguments)
    assert "\n" not in str(caught.value)


def test_bad_command_lines_exit_2_and_write_nothing(tmp_path, capsys):
    script, _ = _memorising(tmp_path)
    out = tmp_path / "out"
    base = ["--dataset", "digits", "--claim-epsilon", "1", "--delta", "1e-5", "--out", str(out), "--quiet"]
    for argv in (["audit-training", str(script), *base],  # no :FUNCTION
                 ["audit-training", f"{tmp_path / 'absent.py'}:train", *base],
                 ["audit-training", f"{script}:missing", *base],
                 ["audit-training", f"{script}:train", *base, "--models", "1"],
                 ["audit-training", f"{script}:train", *base, "--dataset", "nope"]):
        assert main(argv) == 2, argv
        error = capsys.readouterr().err
        assert error.startswith("dpfl-audit: error:") and error.count("\n") == 1, error
    assert not out.exists()

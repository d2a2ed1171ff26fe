"""A defense is a value: what a run derives from its data lives in that run's own state.

Planning binds one defense object per experiment (``cls(params, layout)``) and every run of the
experiment — trained alone, or together with the others (:func:`defenses.run_batch.train_together`)
— uses that one object. A run's model, claim, metrics and server view must therefore be exactly
what the run gives alone, for every registered defense: runs whose clients differ in size (NbAFL's
noise depends on the smallest client) and seed (FL-TOP's public batch, clip and mask), with the
canary clients each defense takes. Nothing can be written to a defense after construction.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import defenses.catalog  # noqa: F401  (registers every defense)
from audit.core.errors import UserInputError
from defenses.base import DEFENSES, Defense
from defenses.blocks.dirac_rows import DiracRows
from defenses.blocks.flat import ParamLayout
from defenses.federated.training_job import NO_STATE, DefenseState, RecordSpec, TrainingDiverged, TrainingJob
from defenses.nbafl import NbAFL
from defenses.run_batch import train_together

#: the package's defenses (other tests register deliberately broken ones, named test-*)
NAMES = [name for name in DEFENSES.names() if not name.startswith("test-")]


def _job_for(cls: type[Defense], job: TrainingJob) -> TrainingJob:
    """``job`` with the training settings the defense's analysis accepts (DDGauss: exactly n clients
    a round, fixed-size sampling); otherwise Poisson at 0.7, so rounds differ between runs."""
    layout = ParamLayout.of(job.model_factory())
    for training in (replace(job.training, client_rate=0.7), replace(job.training, sampling="fixed", clients_per_round=4)):
        try:
            cls(None, layout).validate(training, len(job.clients))
        except UserInputError:
            continue
        return replace(job, training=training)
    raise AssertionError(f"{cls.name}: no training settings of the test are valid")


def _runs(job: TrainingJob, defense: Defense) -> list[TrainingJob]:
    """Three runs of one experiment: other seeds, and run k keeps k + 1 records of client k (so the
    smallest client differs); canary clients where the defense takes them — update canaries in run 0,
    Dirac canary clients in run 1."""
    runs = []
    for k in range(3):
        clients = [c if i != k else c[: k + 1] for i, c in enumerate(job.clients)]
        runs.append(replace(job, seed=job.seed + 7 * k, clients=clients))
    hooks = defense.audit_hooks()
    dim = defense.layout.dim
    if hooks.update_canaries and type(defense).train is Defense.train:
        directions = torch.nn.functional.normalize(torch.randn(4, dim, generator=torch.Generator().manual_seed(0)), dim=1)
        runs[0] = replace(runs[0], update_canaries=directions)
    if hooks.dirac_canaries_refused(job.training) is None:
        runs[1] = replace(runs[1], dirac_canaries=DiracRows(torch.tensor([3, 50, 700, 900]),
                                                            torch.tensor([1.0, -1.0, 0.0, 1.0]), dim))
    return runs


def _result(outcome) -> dict:
    """Everything of a run a figure can come from, in comparable form."""
    if isinstance(outcome, TrainingDiverged):
        return {"diverged": (outcome.round, outcome.what), "metrics": outcome.metrics}
    return {"params": {n: v.clone() for n, v in outcome.final_params.items()}, "claim": outcome.claim.as_dict(),
            "metrics": outcome.metrics, "view": dict(outcome.server_view)}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a.nan_to_num(123.0),
                                                                                        b.nan_to_num(123.0)))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _differences(alone: dict, together: dict, where: str = "") -> list[str]:
    """Where two results differ (keys), for the failure message."""
    if isinstance(alone, dict) and isinstance(together, dict) and list(alone) == list(together):
        return [d for k in alone for d in _differences(alone[k], together[k], f"{where}/{k}")]
    return [] if _same(alone, together) else [where or "/"]


@pytest.mark.parametrize("name", NAMES)
def test_every_run_is_the_same_alone_or_together(digits_job, name):
    """Bit for bit, with the one defense object planning binds: each run alone (its own fresh object)
    and all runs trained together with the shared object give the same model, claim, metrics and
    server view."""
    cls = DEFENSES.get(name)
    job = _job_for(cls, replace(digits_job(rounds=2, local_steps=1),
                                record=RecordSpec(global_rounds="all", upload_rounds="all")))
    layout = ParamLayout.of(job.model_factory())
    shared = cls(None, layout)  # as planning binds it: audit/planning.py
    runs = _runs(job, shared)
    alone = [_result(_train_alone(cls(None, layout), run)) for run in runs]
    together = [_result(outcome) for outcome in train_together(shared, runs)]
    for k, (a, b) in enumerate(zip(alone, together)):
        assert _same(a, b), f"{name} run {k}: differs together vs alone at {_differences(a, b)[:6]}"
    claims = [a["claim"]["epsilon"] for a in alone if "claim" in a]
    if name == "nbafl":  # the runs' smallest clients differ, so do their claims: a shared figure would be wrong
        assert len(set(claims)) == len(claims)


def _train_alone(defense: Defense, job: TrainingJob):
    try:
        return defense.train(job)
    except TrainingDiverged as diverged:
        return diverged


@pytest.mark.parametrize("name", NAMES)
def test_a_defense_takes_no_attribute_after_construction(digits_job, name):
    """Construction is the only time a defense is written: assigning or deleting any attribute raises,
    and a run (prepare, every round, the claim) leaves the object exactly as it was."""
    cls = DEFENSES.get(name)
    job = _job_for(cls, digits_job(rounds=1, local_steps=1))
    defense = cls(None, ParamLayout.of(job.model_factory()))
    before = dict(vars(defense))
    with pytest.raises(AttributeError, match="immutable value"):
        defense._smallest = 1
    with pytest.raises(AttributeError, match="immutable value"):
        defense.params = defense.params
    with pytest.raises(AttributeError, match="immutable value"):
        del defense.layout
    _train_alone(defense, job)
    assert vars(defense) == before and set(vars(defense)) == {"params", "layout"}


def test_params_are_frozen_all_the_way_down():
    """A defense's params are a frozen dataclass; list values are kept as tuples, so nothing reachable
    from a shared defense can change; a mutable Params class is refused by name."""
    from dataclasses import dataclass, field

    from defenses.udp_fl import UDPFL, UDPFLParams

    defense = UDPFL(UDPFLParams(client_epsilons=[1.0, 8.0]))
    assert defense.params.client_epsilons == (1.0, 8.0)

    @dataclass
    class Loose:
        clip: float = 1.0
        extra: list = field(default_factory=list)

    with pytest.raises(TypeError, match=r"frozen=True"):
        NbAFL(Loose())


def test_prepare_must_return_a_state_value(digits_job):
    """The engine keeps what ``prepare`` returns per run: anything but a DefenseState is refused by name."""

    class Returns(NbAFL):
        name = "test-returns-a-dict"

        def prepare(self, job, model=None, initial=None):
            return {"smallest": 3}

    with pytest.raises(TypeError, match="test-returns-a-dict.*must return a DefenseState"):
        Returns().train(digits_job(rounds=1))
    assert isinstance(NO_STATE, DefenseState)


def test_a_user_defense_that_keeps_run_data_on_itself_fails_loudly(digits_job):
    """The bug this design rules out, written as a user would write it: ``prepare`` storing the run's
    smallest client on ``self``. It raises at once instead of letting runs overwrite each other."""

    class Remembers(NbAFL):
        name = "test-remembers"

        def prepare(self, job, model=None, initial=None):
            self.smallest = min(len(c) for c in job.clients)
            return super().prepare(job, model, initial)

    with pytest.raises(AttributeError, match="Remembers.smallest: a defense is an immutable value"):
        Remembers().train(digits_job(rounds=1))


def test_nbafl_runs_keep_their_own_smallest_client(digits_job):
    """Three runs whose smallest clients hold 2, 12 and 22 records: each claim is the one for its own m,
    alone or together, and m is what the claim's mechanism names."""
    job = digits_job(rounds=2)
    layout = ParamLayout.of(job.model_factory())
    defense = NbAFL(None, layout)
    runs = [replace(job, seed=job.seed + k, clients=[c[:m] if i == 0 else c for i, c in enumerate(job.clients)])
            for k, m in enumerate((2, 12, 22))]
    assert [min(len(c) for c in run.clients) for run in runs] == [2, 12, 22]
    alone = [NbAFL(None, layout).train(run).claim for run in runs]
    together = [outcome.claim for outcome in train_together(defense, runs)]
    assert [c.epsilon for c in alone] == [c.epsilon for c in together]
    assert len({c.epsilon for c in alone}) == 3
    assert [f"m = {m})" in c.mechanism for c, m in zip(alone, (2, 12, 22))] == [True] * 3
    assert np.all(np.diff([c.epsilon for c in alone]) > 0)  # a smaller m means more noise: a smaller ε


def _writes_self(target) -> bool:
    """Whether an assignment target writes into ``self``: ``self.x``, ``self.x[k]``, ``self.x.y`` (a
    container a defense holds, too), or any of them inside a tuple target."""
    import ast

    if isinstance(target, ast.Tuple | ast.List):
        return any(_writes_self(t) for t in target.elts)
    if not isinstance(target, ast.Attribute | ast.Subscript):
        return False
    while isinstance(target, ast.Attribute | ast.Subscript):
        target = target.value
    return isinstance(target, ast.Name) and target.id == "self"


def _assigned_attributes(cls: type) -> list[str]:
    """``self.x = …``, ``self.x[k] = …`` (or ``+=``, or ``setattr(self, …)``/``object.__setattr__(self, …)``)
    in the methods ``cls`` defines itself, as ``file:line``."""
    import ast
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return []
    start = inspect.getsourcelines(cls)[1]
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("setattr", "__setattr__"):
                found.append(f"{inspect.getsourcefile(cls)}:{start + node.lineno - 1}")
        if any(_writes_self(target) for target in targets):
            found.append(f"{inspect.getsourcefile(cls)}:{start + node.lineno - 1}")
    return found


def test_no_defense_class_writes_to_itself():
    """Statically, beside the runtime guard: no method of any class in a registered defense's hierarchy
    (mixins included) assigns to ``self`` — except :class:`Defense.__init__`, which sets ``params`` and
    ``layout`` once."""
    # every class a registered defense inherits methods from, mixins included
    classes = {klass for name in NAMES for klass in DEFENSES.get(name).__mro__ if klass not in (object, Defense)}
    assert len(classes) > len(NAMES) // 2
    offenders = {klass.__qualname__: _assigned_attributes(klass) for klass in classes}
    assert not {k: v for k, v in offenders.items() if v}
    assert len(_assigned_attributes(Defense)) == 2  # params and layout, in __init__, through object.__setattr__

"""The membership design builds the neighbouring datasets the claim speaks of.

A run is a function of its inclusion coins. Toggling one coin must give exactly one neighbour:
under add/remove, one client more or fewer (client unit) or one record more or fewer in its owner
client's data and nowhere else (record unit); under replace-one, one client of a pair swapped for
the other, the number of clients unchanged. And the coins must be independent (the one-run ε
bound of Steinke et al. 2023 needs it): a design that trains every run on exactly N of C
candidates makes two candidates' coins negatively correlated, −1/(C − 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from audit.config import MembershipConfig, PartitionConfig, load_config
from audit.core.errors import UserInputError
from audit.planning import plan_audit
from audit.tasks import client_membership, record_membership

LABELS = np.arange(400) % 10


def _as_sets(clients: list[np.ndarray]) -> list[frozenset[int]]:
    return sorted((frozenset(int(i) for i in c) for c in clients), key=sorted)


@pytest.mark.parametrize("run", [0, 3])
def test_a_client_coin_adds_or_removes_exactly_one_client(run):
    design = client_membership(LABELS, MembershipConfig(runs=6), PartitionConfig(clients=10), seed=1)
    coins = design.coins(run)
    for candidate in range(len(coins)):
        with_it, without = coins.copy(), coins.copy()
        with_it[candidate], without[candidate] = True, False
        bigger, smaller = _as_sets(design.run_clients(run, with_it)), _as_sets(design.run_clients(run, without))
        assert len(bigger) == len(smaller) + 1
        added = frozenset(int(i) for i in design.parts[candidate])
        assert sorted(smaller + [added], key=sorted) == bigger  # the same clients, plus exactly that one
    assert _as_sets(design.run_clients(run)) == _as_sets(design.clients[run])


def test_a_record_coin_changes_only_its_owner_clients_data_by_that_record():
    design = record_membership(LABELS, MembershipConfig(runs=4), PartitionConfig(clients=8), seed=2)
    coins = design.coins(1)
    for record in range(0, len(coins), 7):
        with_it, without = coins.copy(), coins.copy()
        with_it[record], without[record] = True, False
        a, b = design.run_clients(1, with_it), design.run_clients(1, without)
        assert len(a) == len(b) == 8  # the clients stay; only data changes
        changed = [c for c in range(8) if not np.array_equal(a[c], b[c])]
        assert changed == [design.owners[record]]
        assert set(a[changed[0]].tolist()) - set(b[changed[0]].tolist()) == {record}
        assert set(b[changed[0]].tolist()) <= set(a[changed[0]].tolist())


def test_a_replace_one_coin_swaps_one_client_of_a_pair():
    design = client_membership(LABELS, MembershipConfig(runs=5, relation="replace-one"), PartitionConfig(clients=6), seed=3)
    assert design.relation == "replace-one" and design.client_keep.shape == (5, 12)
    assert (design.client_keep.sum(1) == 6).all()  # every run has N clients
    assert (design.client_keep[:, 0::2] != design.client_keep[:, 1::2]).all()  # one of each pair
    coins = design.coins(2)
    for pair in range(6):
        swapped = coins.copy()
        swapped[2 * pair], swapped[2 * pair + 1] = coins[2 * pair + 1], coins[2 * pair]
        a, b = _as_sets(design.run_clients(2, coins)), _as_sets(design.run_clients(2, swapped))
        assert len(a) == len(b) == 6 and len(set(a) - set(b)) == 1 and len(set(b) - set(a)) == 1
        gone, came = (set(a) - set(b)).pop(), (set(b) - set(a)).pop()
        pair_sets = {frozenset(int(i) for i in design.parts[2 * pair]), frozenset(int(i) for i in design.parts[2 * pair + 1])}
        assert {gone, came} == pair_sets


def test_client_coins_are_independent_and_fair():
    """Over 600 runs with C = 12 candidates: each coin's rate is ½, two coins are uncorrelated,
    and the number of clients per run is Binomial(12, ½) — variance 3 — where a fixed-size
    design would give variance 0 and pairwise correlation −1/11."""
    design = client_membership(LABELS, MembershipConfig(runs=600), PartitionConfig(clients=6), seed=4)
    keep = design.client_keep.astype(float)
    assert keep.shape[1] == 12
    assert np.all(np.abs(keep.mean(0) - 0.5) < 4 * 0.5 / np.sqrt(600))
    correlation = np.corrcoef(keep.T)[np.triu_indices(12, 1)]
    # each ρ̂ has SE 1/√600 ≈ 0.041 and the 66 are nearly uncorrelated: their mean has SE ≈ 0.005
    assert abs(correlation.mean()) < 0.03, correlation.mean()  # a fixed-size design: −1/11 ≈ −0.091
    counts = keep.sum(1)
    assert abs(counts.var(ddof=1) - 3.0) < 4 * 3.0 * np.sqrt(2 / 600)  # ±0.69 around Binomial's 3


def test_replace_one_needs_the_client_unit_and_fair_pairs():
    with pytest.raises(UserInputError, match="membership.relation"):
        record_membership(LABELS, MembershipConfig(runs=2, relation="replace-one"), PartitionConfig(clients=4), seed=0)
    with pytest.raises(UserInputError, match="membership.inclusion"):
        client_membership(LABELS, MembershipConfig(runs=2, relation="replace-one", inclusion=0.3), PartitionConfig(clients=4), 0)


def test_a_zero_out_coin_empties_one_clients_data_and_keeps_every_participant():
    design = client_membership(LABELS, MembershipConfig(runs=4, relation="zero-out"), PartitionConfig(clients=8), seed=5)
    assert design.client_keep.shape == (4, 8)
    coins = design.coins(0)
    for client in range(8):
        on, off = coins.copy(), coins.copy()
        on[client], off[client] = True, False
        a, b = design.run_clients(0, on), design.run_clients(0, off)
        assert len(a) == len(b) == 8  # who takes part is the same on both sides
        assert [c for c in range(8) if not np.array_equal(a[c], b[c])] == [client]
        assert len(b[client]) == 0 and np.array_equal(a[client], design.parts[client])


def test_dp_fedavg_dividing_by_the_realized_count_claims_zero_out_and_the_design_follows():
    """(Σ clipped + N(0, σ²S²))/|P_t| reveals |P_t|: a neighbour with one client fewer changes the
    noise scale, which the Gaussian analysis does not cover; keeping the client and zeroing its
    contribution leaves |P_t| alone. Dividing by the expected count is add/remove."""
    def plan(params: dict):
        overrides = {"dataset": {"name": "digits", "max_pool": 200, "max_test": 50}, "partition": {"clients": 6},
                     "training": {"rounds": 1}, "membership": {"runs": 2},
                     "defenses": [{"name": "dp-fedavg", "epsilons": [2], "params": params}],
                     "attacks": [{"name": "loss-threshold"}]}
        return plan_audit(load_config(overrides=overrides))

    realized = plan({})
    assert realized.experiments[0].claim.relation == "zero-out"
    assert realized.membership.unit == "client" and realized.membership.relation == "zero-out"
    expected = plan({"denominator": "expected"})
    assert expected.experiments[0].claim.relation == "add-remove"
    assert expected.membership.relation == "add-remove"


def test_a_zero_out_run_without_any_data_is_audited_without_a_crash_or_a_blind_canary_audit(tmp_path):
    """With 5 clients a zero-out run has no data at all with probability 1/32 (the smoke preset's
    run 0 at seed 29). Canary runs then train on the next run that has data — FedAvg weighs
    uploads by data size, so canary clients beside only empty ones would weigh nothing and
    non-private FedAvg would look leak-free — and gradient inversion says why it was not attempted."""
    from audit.attacking import attack_runs
    from audit.pipeline import train
    from audit.summary import build_results

    overrides = {"seed": 29, "attacks": [{"name": "client-canaries"}, {"name": "gradient-inversion",
                                                                       "params": {"iterations": 5, "batch_size": 1}}],
                 "defenses": [{"name": "fedavg"}, {"name": "dp-fedavg", "epsilons": [8]}]}
    plan = plan_audit(load_config(preset_name="smoke", overrides=overrides))
    assert plan.membership.relation == "zero-out"
    empty = [r for r, clients in enumerate(plan.clients) if not any(len(c) for c in clients)]
    assert empty == [0]
    assert [plan.canary_base_run(i) for i in range(8)] == [1, 2, 3, 4, 5, 6, 7, 1]
    trained = train(plan, tmp_path)
    results = build_results(plan, trained, attack_runs(plan, trained, tmp_path, quiet=True))
    fedavg = next(e for e in results.experiments if e.defense == "fedavg")
    by_name = {a.attack: a for a in fedavg.attacks}
    assert by_name["client-canaries"].metrics["auc"].value == 1.0  # every canary client found
    assert by_name["gradient-inversion"].notes.startswith("not attempted: 0 of the target run's 5 clients hold 1 records")

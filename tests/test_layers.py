"""The import architecture: arrows point down the layers, and no new cycles appear.

Layers, lowest first: ``audit.core`` → ``defenses`` → ``attacks`` → ``reports`` → the rest of
``audit``. ``lint-imports`` (pyproject's contracts, run by .ci/run) enforces them; these tests
check what a contract cannot: that its list of orchestration modules is complete, and that the
import graph has no cycles — neither at run time nor counting the imports under
``TYPE_CHECKING`` (annotations only): the engine names the :class:`RoundDefense` protocol, not
``defenses.base.Defense``, which builds on the engine.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest
import tomllib

import audit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("audit", "defenses", "attacks", "reports")
LAYER = {"audit.core": 0, "defenses": 1, "attacks": 2, "reports": 3, "audit": 4}

def layer(module: str) -> int:
    return LAYER["audit.core"] if module.startswith("audit.core") else LAYER[module.split(".")[0]]


@pytest.fixture(scope="module")
def graph():
    grimp = pytest.importorskip("grimp")
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)


def test_every_import_points_down_the_layers(graph):
    upward = sorted((importer, imported) for importer in graph.modules
                    for imported in graph.find_modules_directly_imported_by(importer)
                    if layer(imported) > layer(importer))
    assert upward == []


def test_the_forbidden_contract_names_every_orchestration_module():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    forbidden = next(c for c in contracts if c["type"] == "forbidden")["forbidden_modules"]
    top = {f"audit.{info.name}" for info in pkgutil.iter_modules(audit.__path__) if info.name != "core"}
    assert top == set(forbidden)


def _cycles(graph) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_no_import_cycles(graph):
    assert _cycles(graph) == set()


def test_no_import_cycles_counting_type_checking_imports():
    grimp = pytest.importorskip("grimp")
    annotated = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)
    assert _cycles(annotated) == set()


def test_every_registered_defense_is_what_the_engine_runs():
    # the engine's RoundDefense protocol: mypy checks the signatures where a defense meets the
    # engine; this checks that no registered defense lacks a member
    import defenses.catalog  # noqa: F401 - registers every defense
    from defenses.base import DEFENSES
    from defenses.federated.round_defense import RoundDefense

    assert len(DEFENSES.names()) >= 20
    for name in DEFENSES.names():
        assert isinstance(DEFENSES.get(name)(), RoundDefense), name


class _NotADefense:
    params = layout = None


def test_the_protocol_check_can_fail():
    from defenses.federated.round_defense import RoundDefense

    assert not isinstance(_NotADefense(), RoundDefense)


def _top_level_classes() -> dict[str, list[str]]:
    """Every top-level class name of the product's packages, with the files that define it."""
    import ast

    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    return found


def test_one_class_per_name():
    # a newcomer who reads `Plan` or `Relation` must find one class, not two meanings
    found = _top_level_classes()
    assert len(found) > 100  # the scan sees the product
    assert {name: files for name, files in found.items() if len(files) > 1} == {}

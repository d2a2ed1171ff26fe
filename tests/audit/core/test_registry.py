"""A component is named once: a class registered bare is found under its own ``name``, and a
name that disagrees with the class's is refused at import, not discovered in a report."""

from __future__ import annotations

import pytest

from attacks.base import ATTACKS
from audit.core.registry import Registry
from audit.core.vocabulary import AttackKind
from defenses.base import DEFENSES


class Named:
    name = "named"


class Unnamed:
    name = ""


def test_a_bare_registration_uses_the_class_name():
    registry: Registry[type] = Registry("thing")
    assert registry.register(Named) is Named
    assert registry.names() == ["named"] and registry.get("named") is Named


def test_a_name_that_disagrees_with_the_class_or_is_missing_is_refused():
    registry: Registry[type] = Registry("thing")
    with pytest.raises(ValueError, match="says name = 'named' but is registered as 'other'"):
        registry.register("other")(Named)
    with pytest.raises(ValueError, match="non-empty `name`"):
        registry.register(Unnamed)
    registry.register(Named)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(Named)


def test_every_packaged_attack_and_defense_is_registered_under_its_own_name():
    import attacks.catalog  # noqa: F401 - registers the attacks
    import defenses.catalog  # noqa: F401 - registers the defenses

    for registry in (ATTACKS, DEFENSES):
        for name in registry.names():
            assert registry.get(name).name == name
    assert {ATTACKS.get(name).kind for name in ATTACKS.names()} == set(AttackKind)

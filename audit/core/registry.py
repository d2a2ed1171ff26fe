"""A name → factory registry, shared by datasets, models, defenses and attacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from audit.core.errors import UserInputError
from audit.core.extensions import is_reference, resolve

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps registry names to entries; ``get`` also accepts ``module:callable`` references."""

    def __init__(self, kind: str, base: type | None = None):
        """``base``: entries are subclasses of it (a ``module:callable`` reference that is not one
        is refused with one line, before it is used)."""
        self.kind = kind
        self.base = base
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: T) -> T: ...

    def register(self, name):
        """``@REGISTRY.register("name")`` on a factory, or bare ``@REGISTRY.register`` on a class
        that says its own ``name`` (an attack, a defense): the class is then named once, by its
        ``name``, and the registry cannot disagree with the label it prints."""
        if isinstance(name, str):
            return lambda entry: self._put(name, entry)
        return self._put(_own_name(name, self.kind), name)

    def _put(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' registered twice")
        own = getattr(entry, "name", None) if isinstance(entry, type) else None
        if isinstance(own, str) and own and own != name:
            what = getattr(entry, "__qualname__", "")
            raise ValueError(f"{self.kind} class {what} says name = '{own}' but is registered as '{name}'")
        self._entries[name] = entry
        return entry

    def add(self, name: str, entry: T) -> None:
        self._put(name, entry)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries or is_reference(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str, field: str | None = None) -> T:
        field = field or self.kind
        if name in self._entries:
            return self._entries[name]
        if is_reference(name):
            entry = resolve(name, field)
            if self.base is not None and not (isinstance(entry, type) and issubclass(entry, self.base)):
                base = f"{self.base.__module__}.{self.base.__qualname__}"
                raise UserInputError(f"{field}: '{name}' is not a subclass of {base}; allowed: a class that extends {base}")
            return entry  # type: ignore[return-value]
        raise UserInputError(
            f"{field}: unknown {self.kind} '{name}'; allowed: {', '.join(self.names())} "
            f"(or 'module:callable')"
        )


def _own_name(entry, kind: str) -> str:
    name = getattr(entry, "name", None)
    if not isinstance(name, str) or not name:
        what = getattr(entry, "__qualname__", entry)
        raise ValueError(f"{kind} {what!r}: a bare @register needs a class with a non-empty `name`")
    return name

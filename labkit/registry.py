"""One registry type for everything chosen by name: advantage estimators, policy losses,
verifier losses, Best-of-N selectors, fork positions, bug operators, benchmarks.

A registry maps a ``str`` name to a value (usually a function) plus optional metadata, so a
notebook compares methods by changing one string and a widget can offer exactly the entries
it can run (:meth:`Registry.names` with metadata filters). Registering a different value
under a taken name is an error; the same value again is a no-op. Iteration follows
registration order; :meth:`names` is sorted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

V = TypeVar("V")
_MISSING = object()


class Registry(Generic[V]):
    """Name -> value, with per-entry metadata."""

    def __init__(self, kind: str, same: Callable[[V, V], bool] | None = None):
        """``kind`` names the entries in messages (``"advantage estimator"``); ``same(old,
        new)`` decides whether a second registration is the same entry (default: identity)."""
        self.kind = kind
        self._same = same or (lambda old, new: old is new)
        self._items: dict[str, V] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def add(self, name: str, value: V, **meta: Any) -> V:
        """Register ``value`` as ``name`` with metadata ``meta``; returns ``value``."""
        old = self._items.get(name, _MISSING)
        if old is not _MISSING and not self._same(old, value):
            where = getattr(old, "__qualname__", None) or repr(old)
            raise ValueError(f"{self.kind} {name!r} is already registered to "
                             f"{getattr(old, '__module__', '')}.{where}".replace(" .", " "))
        self._items[name] = value
        self._meta[name] = dict(meta)
        return value

    def register(self, name: str, **meta: Any) -> Callable[[V], V]:
        """Decorator form of :meth:`add`: ``@REGISTRY.register("grpo", credit="sequence")``."""
        def deco(value: V) -> V:
            return self.add(name, value, **meta)
        return deco

    def get(self, name: str, default: Any = _MISSING) -> V:
        """The entry called ``name``; a missing one raises ``KeyError`` listing the registered
        names, unless a ``default`` is given."""
        try:
            return self._items[str(name)]
        except KeyError:
            if default is not _MISSING:
                return default
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {self.names()}") from None

    __getitem__ = get

    def meta(self, name: str) -> Mapping[str, Any]:
        """The metadata registered with ``name``."""
        self.get(name)
        return self._meta[name]

    def names(self, **where: Any) -> list[str]:
        """Sorted names; with ``where``, only entries whose metadata has those values."""
        return sorted(n for n in self._items
                      if all(self._meta[n].get(k) == v for k, v in where.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def keys(self):
        return self._items.keys()

    def values(self):
        return self._items.values()

    def items(self):
        return self._items.items()

"""Name -> function registries, keyed by ``str`` so a notebook compares methods by
changing one string. Registering two different functions under one name is an error."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            old = self._items.get(name)
            if old is not None and old is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered to "
                                 f"{old.__module__}.{old.__qualname__}")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._items[str(name)]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {sorted(self._items)}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

"""Benchmarks, run as ``python -m labkit.bench NAME [options]``.

Each benchmark is a module with ``main(argv: list[str]) -> int`` that prints a human-readable
report and, as its last line, one JSON object of the measured figures (so CI and docs can read
it back). Benchmarks are registered by name and imported only when run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from labkit.registry import Registry

_REGISTRY: Registry[str] = Registry("benchmark", same=str.__eq__)  # name -> "module:function"


def register(name: str, target: str) -> None:
    """Register ``target`` (``"package.module:function"``) as benchmark ``name``.

    Registering a different target under a taken name is an error; the same one is a no-op.
    """
    _REGISTRY.add(name, target)


def names() -> list[str]:
    """The registered benchmark names, sorted."""
    return _REGISTRY.names()


def resolve(name: str) -> Callable[[list[str]], int]:
    """The ``main`` function of benchmark ``name`` (imports its module)."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(names())}")
    module, _, function = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), function)


register("fork", "labkit.bench.fork:main")
register("rollout", "labkit.bench.rollout:main")
register("sandbox", "labkit.bench.sandbox:main")
register("step", "labkit.bench.step:main")
register("trl", "labkit.bench.trl:main")

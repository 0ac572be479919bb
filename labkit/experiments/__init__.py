"""Experiments that compare training methods over several seeds and write
``docs/results/<name>.{json,md,html,png}``.

Each experiment is a module of this package with a config dataclass ``Config``, a function
``run(config) -> Path`` (trains, evaluates, writes the page) and a pure ``render(results) ->
str`` (the page from its JSON); ``python -m labkit experiment NAME --set key=value`` finds it
through :data:`EXPERIMENTS`. What they share lives by concern: :mod:`.config` (the budget and
each run's training config), :mod:`.runs` (training every method and seed, reusing finished
runs), :mod:`.paired` (the paired held-out evaluation), :mod:`.stats` (intervals, the verdict,
the minimum detectable effect) and :mod:`.pages` (the one page writer and its blocks).
"""

from __future__ import annotations

EXPERIMENTS = ("learning", "reshaping", "didpo", "credit", "mucode")
"""Experiment modules under ``labkit.experiments`` (each defines ``Config``, ``run`` and
``render``)."""


def load(name: str):
    """The experiment module called ``name`` (``Config``, ``run``, ``render``), with a clear error."""
    import importlib

    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}")
    try:
        return importlib.import_module(f"labkit.experiments.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"labkit.experiments.{name}":
            raise ValueError(f"experiment {name!r} is not built yet") from None
        raise

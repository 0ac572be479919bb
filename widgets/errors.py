"""Where errors raised inside widget callbacks go.

A callback runs when a slider moves, a button is clicked or the trainer emits an event,
often in no cell at all, so an exception (or a print) would vanish or, worse, propagate
into the training loop. Callbacks run inside :func:`shown_in`, which writes the
traceback to the widget's own ``Output`` and lets training go on.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import ipywidgets as ipw


@contextmanager
def shown_in(out: ipw.Output) -> Iterator[None]:
    """Run the block; if it raises, append the traceback to ``out`` instead of raising.

    ``append_stderr`` (not ``with out:``) so it also works from a training thread and
    without a kernel.
    """
    try:
        yield
    except Exception:  # noqa: BLE001 - a view must never stop the loop that feeds it
        out.append_stderr(traceback.format_exc())

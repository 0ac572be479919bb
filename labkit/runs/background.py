"""Training in a background thread, for notebooks: the cell returns, widgets follow the
trainer's events, and the kernel's interrupt stops it quietly.

    job = TrainingThread(run_all)      # run_all(job) trains one trainer or several
    job.start()                        # this cell returns at once; a dashboard draws
    ...
    job.wait()                         # the next cell waits; Interrupt -> "stopped at step N"

``run_all`` hands each trainer it builds to :meth:`TrainingThread.follow` (so that a stop
reaches it) and checks :attr:`TrainingThread.stopping` between trainers.

Why not ``Thread.join``: on Python below 3.13 a ``join`` interrupted by ``KeyboardInterrupt``
(the kernel's interrupt button) marks the still-running thread as ended. The next ``join``
returns at once, the cell ends while training goes on, and ipykernel, which closes the
output channel of every thread it believes ended, makes that thread's widget updates fail
(``zmq.error.ZMQError: Socket operation on non-socket``, printed as "Exception in thread").
:meth:`TrainingThread.wait` waits on an :class:`threading.Event` instead, which an interrupt
leaves intact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class TrainingStopped(KeyboardInterrupt):
    """Training ended by the kernel's interrupt. IPython shows only its message, one line
    such as "stopped at step 3", not a traceback (``_render_traceback_``); raised, it still
    ends the cell as an interrupt does, so Run All stops there."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def stopped_line(trainer: Any) -> str:
    """``"stopped at step N"``, plus the run folder's name when the trainer has one."""
    run_dir = getattr(getattr(trainer, "cfg", None), "run_dir", "") or ""
    name = str(run_dir).rstrip("/").rsplit("/", 1)[-1]
    return f"stopped at step {trainer.step}" + (f" ({name})" if name else "")


class TrainingThread:
    """Run ``fn(job)`` in a daemon thread; :meth:`wait` for it, where the kernel's interrupt
    asks the followed trainer to stop after its current step, waits for that, and prints one
    line, ``stopped at step N``."""

    def __init__(self, fn: Callable[[TrainingThread], Any], poll: float = 0.5):
        self.fn, self.poll = fn, poll
        self.trainer: Any = None
        """The trainer :meth:`follow` was last given (the one a stop reaches)."""
        self.error: BaseException | None = None
        """What ``fn`` raised, re-raised by :meth:`wait`."""
        self.result: Any = None
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="labkit-training")

    # ------------------------------------------------------------------ the thread's side
    def follow(self, trainer: Any) -> Any:
        """The trainer ``fn`` trains now; a stop requested earlier reaches it at once."""
        self.trainer = trainer
        if self._stop.is_set():
            trainer.request_stop()
        return trainer

    @property
    def stopping(self) -> bool:
        """A stop was requested: ``fn`` should start no further trainer."""
        return self._stop.is_set()

    def _run(self) -> None:
        try:
            self.result = self.fn(self)
        except BaseException as e:  # noqa: BLE001 - handed to wait(), in the cell's thread
            self.error = e
        finally:
            self._done.set()

    # ------------------------------------------------------------------ the cell's side
    def start(self) -> TrainingThread:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def request_stop(self) -> None:
        """Stop the followed trainer after its current step, and start no other."""
        self._stop.set()
        if self.trainer is not None:
            self.trainer.request_stop()

    def _wait_done(self) -> None:
        while not self._done.wait(self.poll):
            pass

    def wait(self) -> bool:
        """Block until ``fn`` returns; ``True`` when it ran to its end, ``False`` when the
        kernel's interrupt stopped it (then one line says where). Re-raises what ``fn``
        raised. Interrupts while the last step finishes are ignored: the step ends, then the
        thread."""
        try:
            self._wait_done()
        except KeyboardInterrupt:
            self.request_stop()
            while True:
                try:
                    self._wait_done()
                    break
                except KeyboardInterrupt:
                    continue
            if self.error is not None:
                raise self.error from None
            print(stopped_line(self.trainer) if self.trainer is not None else "stopped")
            return False
        if self.error is not None:
            raise self.error
        return not self._stop.is_set()

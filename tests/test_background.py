"""Training in a background thread (``labkit.runs.background``) and the trainer under the
kernel's interrupt: one line, "stopped at step N", no traceback, and the thread really ends
before the waiting cell does."""

from __future__ import annotations

import _thread
import threading
import time

import pytest

from labkit.runs.background import TrainingStopped, TrainingThread


class FakeTrainer:
    """Steps of ``seconds`` each until asked to stop, as the trainer does (between steps)."""

    def __init__(self, seconds: float = 0.05, steps: int = 10_000):
        self.step, self.seconds, self.steps = 0, seconds, steps
        self._stop = False

    def request_stop(self) -> None:
        self._stop = True

    def train(self) -> None:
        while self.step < self.steps and not self._stop:
            time.sleep(self.seconds)
            self.step += 1


def _interrupt_after(seconds: float) -> threading.Timer:
    """The kernel's interrupt, as the main thread sees it: a KeyboardInterrupt there."""
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    return timer


def test_an_interrupt_stops_the_thread_quietly_and_waits_for_it(capsys):
    trainers = []

    def run_all(job):
        for _ in range(3):
            if job.stopping:
                break
            trainers.append(job.follow(FakeTrainer()))
            trainers[-1].train()
        return "done"

    job = TrainingThread(run_all, poll=0.05).start()
    timer = _interrupt_after(0.4)
    assert job.wait() is False
    timer.join()
    assert job.done and not job._thread.is_alive()  # ended before wait() returned
    assert len(trainers) == 1, "a stop starts no further trainer"
    stopped = trainers[0].step
    assert capsys.readouterr().out == f"stopped at step {stopped}\n"
    time.sleep(0.2)
    assert trainers[0].step == stopped  # no step after the stop


def test_a_run_to_its_end_returns_true_and_errors_reach_the_cell():
    job = TrainingThread(lambda job: job.follow(FakeTrainer(0.0, steps=3)).train(), poll=0.01)
    assert job.start().wait() is True and job.trainer.step == 3

    def broken(job):
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        TrainingThread(broken, poll=0.01).start().wait()


def test_a_stop_before_the_next_trainer_reaches_it():
    job = TrainingThread(lambda job: None)
    job.request_stop()
    trainer = job.follow(FakeTrainer())
    assert trainer._stop and job.stopping


def test_the_interrupted_trainer_says_where_it_stopped_in_one_line(random_model_dir, tmp_path):
    """``Trainer.train`` interrupted mid-step raises :class:`TrainingStopped`, which IPython
    renders as its one-line message, and leaves the run folder marked stopped."""
    from test_trainer import _cfg

    from conftest import toy_tasks
    from labkit.runs.events import RunFolder
    from labkit.loops.trainer import Trainer

    cfg = _cfg(tmp_path / "run", random_model_dir, steps=5)
    trainer = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[])
    trainer.step = 2  # as if two steps ran: the interrupt lands in the third

    def interrupted():
        raise KeyboardInterrupt

    trainer.train_step = interrupted
    with pytest.raises(TrainingStopped) as caught:
        trainer.train(progress=False)
    trainer.close()
    assert isinstance(caught.value, KeyboardInterrupt)  # Run All still stops at the cell
    assert caught.value._render_traceback_() == ["stopped at step 2 (run)"]
    assert RunFolder(cfg.run_dir).running_mark() is None  # the run reads "stopped", not "running"

"""Checkpoints of a training run: written atomically, resumed exactly.

A checkpoint is ``<run>/checkpoints/step_N/``: the trainer's saved state as a list of
:class:`Part` objects (``Trainer.parts``: the trainable weights, the optimiser with the scheduler
and the RNG states, the credit pipeline's running statistics, the progress tracker, the
curriculum, the buggy-code baselines, each rollout stage's state), each writing its files
and what ``state.json`` keeps under its name, then a ``COMPLETE`` marker; written to a
temporary folder and renamed. Loading reads every part first (a part that cannot be read is a
:class:`CheckpointError` naming its file, and nothing has changed), then restores them in
order. New saved state is one more part in the trainer's list: this file does not change.
:class:`Checkpointing` gives the trainer :meth:`save_checkpoint`, :meth:`resume` and
:meth:`load_checkpoint`.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from labkit import provenance


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


class RunFolderError(RuntimeError):
    """The run folder already holds another run; the message says what to do."""


def unreadable_reason(error: Exception) -> str:
    """Why a checkpoint file could not be read, in a few words: the error's type and the first
    sentence of its message, or only the type when the message gives advice to load the file
    some other way (torch's ``weights_only=False``, unsafe for a file that is corrupt)."""
    first = str(error).strip().splitlines()[0].split(". ")[0] if str(error).strip() else ""
    if not first or "weights_only" in str(error) or "Weights only" in first:
        return type(error).__name__
    return f"{type(error).__name__}: {first}"


def held_run_error(run) -> RunFolderError:
    """The error for a new run whose folder (a :class:`~labkit.runs.events.RunFolder`)
    already holds another run."""
    done = len(run.read("metrics.jsonl"))
    return RunFolderError(f"{run.path} already holds a run ({done} steps logged): resume it "
                          "(--resume / Trainer.resume()), train into a new run_dir, or pass "
                          "--overwrite to replace it")


def refuse_busy(run) -> None:
    """Raise :class:`RunFolderError` when another live process trains the run folder ``run``
    (a :class:`~labkit.runs.events.RunFolder`) now, as its running mark says
    (:meth:`~labkit.runs.events.RunFolder.held_elsewhere`)."""
    mark = run.held_elsewhere()
    if mark is None:
        return
    since = time.strftime("%H:%M", time.localtime(mark.get("since", 0)))
    raise RunFolderError(f"{run.path} is being trained by process {mark.get('pid')} on this host "
                         f"(since {since}): wait for it to end or stop it; processes that split "
                         "an experiment must each train other runs")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    done = [p for p in sorted(Path(run_dir).glob("checkpoints/step_*"))
            if p.is_dir() and (p / "COMPLETE").exists()]
    return done[-1] if done else None


# ============================================================================= parts

MISSING = object()
"""What a part reads from ``state.json`` when the checkpoint holds nothing under its name."""


class Part:
    """One piece of a trainer's saved state. :meth:`save` writes its files into a checkpoint
    folder (if it has any) and returns what ``state.json`` keeps under :attr:`name` (``None``
    for a part with files only); :meth:`read` reads it back without changing anything and
    :meth:`restore` puts what it read into the trainer."""

    name: str
    in_state: bool = True
    """Whether ``state.json`` keeps a value under :attr:`name`."""

    def save(self, folder: Path) -> Any:
        return None

    def read(self, folder: Path, value: Any) -> Any:
        """``value``: what ``state.json`` kept under :attr:`name` (:data:`MISSING` if nothing).
        Raises :class:`CheckpointError` naming what cannot be read."""
        if self.in_state and value is MISSING:
            raise CheckpointError(f"checkpoint {folder} was written by an older labkit (no "
                                  f"{self.name} in state.json); train the run again")
        return value

    def restore(self, loaded: Any) -> None:
        return None


@dataclass
class StatePart(Part):
    """A part that lives in ``state.json`` only: ``get()`` gives its JSON value, ``put(value)``
    restores it; ``check(value)`` (optional) returns why a value cannot be restored here."""

    name: str
    get: Callable[[], Any]
    put: Callable[[Any], None] = lambda value: None
    check: Callable[[Any], str] | None = None

    def save(self, folder: Path) -> Any:
        return self.get()

    def read(self, folder: Path, value: Any) -> Any:
        value = super().read(folder, value)
        why = self.check(value) if self.check is not None else ""
        if why:
            raise CheckpointError(f"checkpoint {folder} {why}")
        return value

    def restore(self, loaded: Any) -> None:
        self.put(loaded)


def _torch_file(folder: Path, name: str, weights_only: bool):
    try:
        return torch.load(folder / name, weights_only=weights_only)
    except Exception as e:  # noqa: BLE001 - any unreadable file means a corrupt checkpoint
        raise CheckpointError(f"checkpoint {folder} is corrupt: {name} cannot be read "
                              f"({unreadable_reason(e)})") from None


class WeightsPart(Part):
    """``trainable.pt``: the policy's trainable parameters (the others never move)."""

    name, in_state = "trainable", False

    def __init__(self, policy):
        self.policy = policy

    def save(self, folder: Path) -> None:
        torch.save({n: p.detach().cpu() for n, p in self.policy.model.named_parameters()
                    if p.requires_grad}, folder / "trainable.pt")

    def read(self, folder: Path, value: Any) -> tuple[Path, dict]:
        return folder, _torch_file(folder, "trainable.pt", weights_only=True)

    def restore(self, loaded: tuple[Path, dict]) -> None:
        """Refuses weights of another model before it changes any (it restores first)."""
        folder, trainable = loaded
        params = dict(self.policy.model.named_parameters())
        missing = [n for n in trainable if n not in params]
        if missing:
            raise CheckpointError(f"checkpoint {folder} does not fit this model: unknown "
                                  f"parameters {missing[:3]}")
        with torch.no_grad():
            for n, v in trainable.items():
                params[n].copy_(v)


class OptimiserPart(Part):
    """``optim.pt``: the optimiser, the learning-rate schedule, and torch's and Python's RNG
    states (restored last of the three, so a resumed step draws what the run would have)."""

    name, in_state = "optim", False

    def __init__(self, opt, sched):
        self.opt, self.sched = opt, sched

    def save(self, folder: Path) -> None:
        torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()},
                   folder / "optim.pt")

    def read(self, folder: Path, value: Any) -> dict:
        return _torch_file(folder, "optim.pt", weights_only=False)

    def restore(self, loaded: dict) -> None:
        self.opt.load_state_dict(loaded["optimizer"])
        self.sched.load_state_dict(loaded["scheduler"])
        torch.set_rng_state(loaded["torch_rng"])
        random.setstate(loaded["python_rng"])


class StagePart(Part):
    """A rollout stage's own files (e.g. the fork baseline's ``baseline.pt``)."""

    in_state = False

    def __init__(self, stage, policy, estimator: str):
        self.stage, self.policy, self.estimator = stage, policy, estimator
        self.name = f"stage:{stage.need}"

    def save(self, folder: Path) -> None:
        self.stage.save(self.policy, folder)

    def read(self, folder: Path, value: Any) -> Path:
        return folder

    def restore(self, folder: Path) -> None:
        try:
            self.stage.load(self.policy, folder)
        except FileNotFoundError as e:
            raise CheckpointError(f"{e} (estimator {self.estimator!r})") from None


class Checkpointing:
    """The trainer's checkpoint methods: they walk its :attr:`parts` (and read its ``step``,
    ``run``, ``cfg`` and ``events``)."""

    parts: list[Part]

    def _ckpt_dir(self, step: int) -> Path:
        return self.run.path / "checkpoints" / f"step_{step:06d}"

    def save_checkpoint(self) -> Path:
        final = self._ckpt_dir(self.step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {"step": self.step}
        for part in self.parts:
            value = part.save(tmp)
            if part.in_state:
                state[part.name] = value
        (tmp / "state.json").write_text(json.dumps(state))
        (tmp / "COMPLETE").write_text("ok\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(self.run.path.glob("checkpoints/step_*"))[:-self.cfg.keep_checkpoints]:
            if not old.name.endswith(".tmp"):
                shutil.rmtree(old, ignore_errors=True)
        self.events.emit("on_checkpoint", trainer=self, step=self.step, path=final)
        return final

    def resume(self, allow_code_drift: bool = False) -> int:
        """Continue the run in ``run_dir``: from its newest intact checkpoint (a corrupt newer
        one is skipped, and said so), or from step 0 when it was stopped before its first
        checkpoint (its partial logs are dropped). Stale ``.tmp`` checkpoint folders are
        removed. A run trained by other code (another commit or other uncommitted changes,
        :mod:`labkit.provenance`) is refused (:class:`labkit.provenance.CodeDriftError`) unless
        ``allow_code_drift``; the resume is recorded in its ``provenance.json``. A run that
        another live process trains now is refused (:func:`refuse_busy`) before anything
        in its folder changes. Returns the step training continues from."""
        refuse_busy(self.run)
        for stale in (self.run.path / "checkpoints").glob("*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
            print(f"{stale}: removed a checkpoint left half-written", flush=True)
        self._resumed = True
        done = [p for p in sorted((self.run.path / "checkpoints").glob("step_*"), reverse=True)
                if p.is_dir()]
        if done:  # a checkpoint carries on what that code trained (every rank reads the same record)
            provenance.refuse_drift(self.run.path, "resume", allow_code_drift)
        errors = []
        for path in done:
            try:
                step = self.load_checkpoint(path)
            except CheckpointError as e:
                errors.append(str(e))
                print(f"{e}; trying an older checkpoint", flush=True)
                continue
            if self.is_main:
                provenance.record_resume(self.run.path)
            return step
        if errors:
            raise CheckpointError(f"no intact checkpoint in {self.run.path / 'checkpoints'} ("
                                  + "; ".join(errors) + "): restore one, or train the run "
                                  "again with --overwrite")
        print(f"{self.run.path}: no checkpoint yet; starting from step 0", flush=True)
        for name in ("metrics.jsonl", "rollouts.jsonl", "eval.jsonl", "anchors.jsonl"):
            self.run.truncate_after(name, -1)
        return 0

    def load_checkpoint(self, path: str | Path | None = None) -> int:
        """Restore from ``path`` (default: the newest complete checkpoint of the run) and
        drop log rows written after it. Returns the restored step."""
        path = Path(path) if path else latest_checkpoint(self.run.path)
        if path is None:
            raise CheckpointError(f"no complete checkpoint in {self.run.path / 'checkpoints'}")
        if not (path / "COMPLETE").exists():
            raise CheckpointError(f"checkpoint {path} is incomplete (no COMPLETE marker); "
                                  "it was being written when the run stopped: resume from an older one")
        state, unreadable = {}, None
        try:
            state = json.loads((path / "state.json").read_text())
        except Exception as e:  # noqa: BLE001 - any unreadable file means a corrupt checkpoint
            unreadable = CheckpointError(f"checkpoint {path} is corrupt: state.json cannot be "
                                         f"read ({unreadable_reason(e)})")
        loaded = []
        for part in self.parts:  # in order: the first part that cannot be read is named
            if part.in_state and unreadable is not None:
                raise unreadable
            loaded.append(part.read(path, state.get(part.name, MISSING)))
        if unreadable is not None:
            raise unreadable
        for part, value in zip(self.parts, loaded):
            part.restore(value)
        self.step = int(state["step"])
        self._resumed = True
        for name in ("metrics.jsonl", "rollouts.jsonl", "eval.jsonl", "anchors.jsonl"):
            self.run.truncate_after(name, self.step)
        return self.step

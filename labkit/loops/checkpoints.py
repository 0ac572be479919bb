"""Checkpoints of a training run: written atomically, resumed exactly.

A checkpoint is ``<run>/checkpoints/step_N/`` (trainable weights, optimiser, scheduler, RNG
states, the credit pipeline's running statistics, the progress tracker, the curriculum, the
buggy-code baselines, each rollout stage's state, then a ``COMPLETE`` marker), written to a
temporary folder and renamed. :class:`Checkpointing` gives the trainer :meth:`save_checkpoint`,
:meth:`resume` and :meth:`load_checkpoint`.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

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


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    done = [p for p in sorted(Path(run_dir).glob("checkpoints/step_*"))
            if p.is_dir() and (p / "COMPLETE").exists()]
    return done[-1] if done else None


class Checkpointing:
    """The trainer's checkpoint methods (they read and write its state)."""

    def _ckpt_dir(self, step: int) -> Path:
        return self.run.path / "checkpoints" / f"step_{step:06d}"

    def save_checkpoint(self) -> Path:
        final = self._ckpt_dir(self.step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        trainable = {n: p.detach().cpu() for n, p in self.policy.model.named_parameters() if p.requires_grad}
        torch.save(trainable, tmp / "trainable.pt")
        torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()},
                   tmp / "optim.pt")
        state = {"step": self.step, "reshaper": self.credit.state_dict(),
                 "progress": self.progress.state_dict(),
                 "curriculum": self.curriculum.state_dict() if self.curriculum else None,
                 "baselines": self.baselines.state_dict(), "lora": self.policy.is_lora}
        (tmp / "state.json").write_text(json.dumps(state))
        for stage in self.stages:
            stage.save(self.policy, tmp)  # e.g. the fork baseline
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
        ``allow_code_drift``; the resume is recorded in its ``provenance.json``. Returns the
        step training continues from."""
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
        name = "trainable.pt"
        try:
            trainable = torch.load(path / name, weights_only=True)
            name = "optim.pt"
            opt_state = torch.load(path / name, weights_only=False)
            name = "state.json"
            state = json.loads((path / name).read_text())
        except Exception as e:  # noqa: BLE001 - any unreadable file means a corrupt checkpoint
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} cannot be read "
                                  f"({unreadable_reason(e)})") from None
        if state["lora"] != self.policy.is_lora:
            raise CheckpointError(f"checkpoint {path} was saved with lora={state['lora']}, "
                                  f"but this policy has lora={self.policy.is_lora}")
        params = dict(self.policy.model.named_parameters())
        missing = [n for n in trainable if n not in params]
        if missing:
            raise CheckpointError(f"checkpoint {path} does not fit this model: unknown parameters "
                                  f"{missing[:3]}")
        with torch.no_grad():
            for n, v in trainable.items():
                params[n].copy_(v)
        self.opt.load_state_dict(opt_state["optimizer"])
        self.sched.load_state_dict(opt_state["scheduler"])
        torch.set_rng_state(opt_state["torch_rng"])
        random.setstate(opt_state["python_rng"])
        self.credit.load_state_dict(state["reshaper"])
        self.progress.load_state_dict(state["progress"])
        if self.curriculum is not None and state["curriculum"]:
            self.curriculum.load_state_dict(state["curriculum"])
        if "baselines" not in state:
            raise CheckpointError(f"checkpoint {path} was written by an older labkit (no buggy-code "
                                  "baselines); train the run again")
        self.baselines.load_state_dict(state["baselines"])
        try:
            for stage in self.stages:
                stage.load(self.policy, path)  # e.g. the fork baseline
        except FileNotFoundError as e:
            raise CheckpointError(f"{e} (estimator {self.cfg.estimator!r})") from None
        self.step = int(state["step"])
        self._resumed = True
        for name in ("metrics.jsonl", "rollouts.jsonl", "eval.jsonl", "anchors.jsonl"):
            self.run.truncate_after(name, self.step)
        return self.step

"""Data parallel training behind one seam (``accelerate launch`` / ``torchrun``)."""

from __future__ import annotations

import contextlib
import os

import torch


class DataParallel:
    """The one seam for several processes (``accelerate launch`` / ``torchrun``): every process
    samples its own tasks, DDP all-reduces the gradients, process 0 writes the run folder. In
    one process every method is a no-op and ``model`` is the policy's own model."""

    def __init__(self, policy, opt):
        self.world, self.rank, self.accel = 1, 0, None
        self.model, self.opt = policy.model, opt
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.accel = Accelerator(cpu=policy.device.type == "cpu")
            self.world, self.rank = self.accel.num_processes, self.accel.process_index
            self.model, self.opt = self.accel.prepare(policy.model, opt)

    def global_weight(self, weight: float) -> tuple[float, float]:
        """The loss aggregate's weight over every process, and the factor that undoes DDP's
        averaging of the gradients (``world``); ``(weight, 1)`` in one process."""
        if self.world == 1:
            return weight, 1.0
        t = torch.tensor([weight], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t), float(self.world)

    def no_sync(self, model, last: bool):
        """Skip DDP's gradient all-reduce on every micro-batch but the last."""
        if self.accel is None or last:
            return contextlib.nullcontext()
        return self.accel.no_sync(model)

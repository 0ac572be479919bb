"""Run by tests/test_distributed.py under torchrun: 2 CPU processes (gloo) train the toy
tasks for a few steps; each writes a digest of its parameters and what it sampled."""

import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import toy_tasks  # noqa: E402

from labkit.config import from_dict  # noqa: E402
from labkit.loops.trainer import Trainer, TrainConfig  # noqa: E402

run_dir, model_dir = sys.argv[1], sys.argv[2]
cfg = from_dict(TrainConfig, {
    "run_dir": run_dir, "seed": 5, "steps": 2, "tasks_per_step": 2,
    "policy": {"spec": model_dir, "reference": "none"},
    "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 16},
    "tasks": {"source": "records", "eval_tasks": 0},
    "loss": {"micro_batch_size": 3}, "optim": {"lr": 1e-3},
    "eval_every": 0, "checkpoint_every": 1, "log_rollouts": 0,
})
tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[])
seen = []
tr.events.on("on_rollout", lambda rollouts, **kw: seen.append([r.completion for r in rollouts]))
start = [p.detach().clone() for p in tr.params]
tr.train(progress=False)
tr.close()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in tr.params)).hexdigest()
changed = any(not torch.equal(a, b) for a, b in zip(start, tr.params))
Path(run_dir, f"rank{tr.rank}.json").write_text(json.dumps(
    {"world": tr.world, "digest": digest, "changed": changed, "samples": seen}))

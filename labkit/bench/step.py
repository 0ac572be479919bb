"""One RL training step at the experiments' batch, phase by phase, against this machine's floor.

The step is the experiments' (:func:`labkit.experiments.base_train_config`: 16 tasks x 8
samples at T = 1.6, up to 320 new tokens, a KL reference, the shipped tiny model) on
synthetic tasks of the ``val`` templates (where the model has room to learn). ``--steps``
steps run; the first is a warm-up, the others are measured and their phases averaged:

* ``prefill`` (one forward over the batch's distinct prompts, timed again on its own, on all
  of torch's threads) and ``decode`` (the rest of sampling; with ``parallel_chunks`` > 1 the
  chunks' own prefills run inside their decode threads, so the split is an estimate);
* ``sandbox`` (executing each distinct candidate, beside the feedback components that read
  only the code; ``distinct_programs_per_step`` says how many checks ran) and ``reward``
  (reshaping and the advantage estimator);
* ``update_reference`` (the KL reference's forward), ``update_forward``,
  ``update_backward``, ``update_optimizer``.

The floor is the step's arithmetic divided by this machine's matrix-multiply throughput,
measured in the same run (float32 ``torch.matmul`` at the model's shapes, best of several
repeats, the threads torch uses), once before the steps and once after them; the floor takes
the better of the two, since a shared machine's throughput drifts within a run. Per token a
forward costs ``2 N_layers + 4 L d c`` FLOPs (``N_layers`` the parameters of the transformer blocks,
``c`` the attention context) plus ``2 d V`` for the logits where they are needed; a backward
twice the forward. Counted: prefill of the distinct prompts, decode of the tokens actually
kept (padding rows that keep decoding after their end are waste, reported apart), the
reference forward and the update's forward and backward over each distinct prompt once (the
update shares a group's prompt, as prefill does) and every row's completion. The sandbox has
no FLOP floor and counts in the step, not in the floor.

Last line one JSON object: ``step_s``, ``floor_s``, ``ratio`` (step / floor; target <= 2.5),
``phases`` (seconds), ``flops``, ``matmul_gflops`` (the better of
``matmul_gflops_before_after``), token counts, ``weights_digest`` (of the trained weights).

With ``--dense-share`` each measured step's sampling and update run a second time under
torch's profiler (sampling as one chunk at a time on one thread, as each decode thread runs
its chunks, since the profiler does not see the decode threads; the update from the same
weights and optimiser state, which are put back after it, so the run trains as without the
flag). Their self times split each phase into dense kernels (:data:`DENSE_OPS`: matrix
products, the fused attention and its backward, the fused optimiser) and everything else,
and the JSON adds ``dense_share`` (per phase) and ``dense_bound_s`` / ``dense_bound_ratio``:
the step if every other operation were free (sampling and update scaled by their dense
shares, the sandbox and reward as measured). A bound for what fusing the element-wise work
could give; the profiler's per-operation cost inflates "everything else" a little, so the
true dense share is somewhat higher. The profiled reruns are not counted in ``step_s``.

    python -m labkit.bench step [--steps 3] [--tasks 16] [--group 8] [--sampler inverse_cdf]
                                [--dense-share]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import statistics
import tempfile
import time

import torch

from labkit.env.tasks import load_tasks
from labkit.experiments.config import ExperimentConfig, base_train_config
from labkit.loops.trainer import Trainer
from labkit.policy.loading import load_policy
from labkit.policy.rollout import SAMPLERS, intra_op_threads


def matmul_gflops(m: int, k: int, n: int, repeats: int = 7, inner: int = 20) -> float:
    """Best-of-``repeats`` float32 ``[m, k] @ [k, n]`` throughput in GFLOP/s."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            a @ b
        best = min(best, (time.perf_counter() - t0) / inner)
    return 2 * m * k * n / best / 1e9


def peak_gflops(cfg) -> float:
    """The best of :func:`matmul_gflops` at the block's three matrix shapes over 4,096 rows
    (``d x ff``, ``ff x d``, ``d x d``): this machine's float32 throughput for the floor."""
    d, ff = cfg.hidden_size, cfg.intermediate_size
    return max(matmul_gflops(4096, d, ff), matmul_gflops(4096, ff, d), matmul_gflops(4096, d, d))


def forward_flops(cfg, tokens: int, context: float, logits_tokens: int) -> float:
    """FLOPs of a forward over ``tokens`` positions of mean attention context ``context``,
    with the vocabulary projection on ``logits_tokens`` of them."""
    d, L, ff, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    block = 2 * d * d + 2 * d * kv + 3 * d * ff  # q, o; k, v; gate, up, down
    return tokens * (2 * L * block + 4 * L * d * context) + logits_tokens * 2 * d * V


DENSE_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_fused_adamw_", "aten::_fused_adam_"})
"""Operations that stay when every element-wise operation around them is fused away."""


def dense_share(self_us: dict[str, float]) -> float:
    """``sum(self time of DENSE_OPS) / sum(self time of all operations)``, from a profile's
    self times per operation name (a phase's share of dense kernels)."""
    total = sum(self_us.values())
    if total <= 0:
        raise ValueError("dense_share: the profile holds no CPU time (nothing was recorded)")
    return sum(t for name, t in self_us.items() if name in DENSE_OPS) / total


def _profile_reruns(trainer) -> dict[str, list[dict]]:
    """Wrap ``trainer``'s sampling and update so that, from the second call on, each runs once
    more under torch's profiler (see the module docstring). Returns the records the wrappers
    fill: per call ``{"share": ..., "extra_s": ...}``, ``extra_s`` the wall time the rerun adds
    (for the update with saving and restoring the weights and optimiser state)."""
    from torch.profiler import ProfilerActivity, profile

    rec: dict[str, list[dict]] = {"sample": [], "update": []}
    calls = {"sample": 0, "update": 0}
    step_sample, train_update = trainer._sample, trainer._update

    def dense_share_of(fn, *args) -> float:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(*args)
        return dense_share({e.key: e.self_cpu_time_total for e in prof.key_averages()})

    def sample(tasks, cfg):
        out = step_sample(tasks, cfg)
        calls["sample"] += 1
        if calls["sample"] > 1:
            t0 = time.perf_counter()
            with intra_op_threads(1):
                share = dense_share_of(step_sample, tasks, dataclasses.replace(cfg, parallel_chunks=1))
            rec["sample"].append({"share": share, "extra_s": time.perf_counter() - t0})
        return out

    def update(*args):
        calls["update"] += 1
        if calls["update"] > 1:  # first the profiled rerun, then the counted update from the
            t0 = time.perf_counter()  # same weights and optimiser state
            model, opt = trainer.train_model, trainer.opt
            weights = copy.deepcopy(model.state_dict())
            opt_state = copy.deepcopy(opt.state_dict())
            share = dense_share_of(train_update, *args)
            model.load_state_dict(weights)
            opt.load_state_dict(opt_state)
            rec["update"].append({"share": share, "extra_s": time.perf_counter() - t0})
        return train_update(*args)

    trainer._sample, trainer._update = sample, update
    return rec


def _sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant figures (keeps small floors readable)."""
    return float(f"{x:.{digits}g}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="labkit.bench step", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="steps run; the first is a warm-up")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--policy", default="tiny")
    p.add_argument("--decode-batch", type=int, default=None,
                   help="rows decoded together (sampling.batch_size; default: the experiments')")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="rows per update micro-batch (loss.micro_batch_size; default: the "
                        "experiments')")
    p.add_argument("--test-timeout", type=float, default=None,
                   help="the sandbox's per-test wall limit, s (sandbox.test_timeout_s; default: "
                        "the experiments')")
    p.add_argument("--parallel-chunks", type=int, default=None,
                   help="decode chunks sampled at once (sampling.parallel_chunks; default: the "
                        "experiments', 2 since 2026-12-04)")
    p.add_argument("--update-engine", choices=("lean", "model"), default=None,
                   help="how the update's completions attend their shared prompt (loss.engine; "
                        "default: the experiments', lean since 2026-12-04)")
    p.add_argument("--sampler", choices=SAMPLERS, default=None,
                   help="how decoding draws a token (sampling.sampler; default: the experiments')")
    p.add_argument("--temperature", type=float, default=None,
                   help="the training sampler's temperature (default: the experiments', 1.6 since "
                        "2026-12-03; the figures recorded before ran at 1.0)")
    p.add_argument("--dense-share", action="store_true",
                   help="profile each measured step's sampling and update once more and report "
                        "the step if only dense kernels cost (dense_bound_s, dense_bound_ratio)")
    a = p.parse_args(argv)
    if a.steps < 2:
        p.error("--steps must be >= 2 (the first step is a warm-up)")
    exp = ExperimentConfig(tasks_per_step=a.tasks, group_size=a.group, policy=a.policy,
                           train_split="val", train_problems=a.tasks * a.steps, eval_every=0,
                           eval_tasks=0)
    if a.sampler:
        exp = dataclasses.replace(exp, sampler=a.sampler)
    if a.parallel_chunks is not None:
        if a.parallel_chunks < 1:
            p.error(f"--parallel-chunks must be >= 1, got {a.parallel_chunks}")
        exp = dataclasses.replace(exp, parallel_chunks=a.parallel_chunks)
    if a.temperature is not None:
        if a.temperature <= 0:
            p.error(f"--temperature must be > 0, got {a.temperature}")
        exp = dataclasses.replace(exp, temperature=a.temperature)
    run_dir = tempfile.mkdtemp(prefix="bench-step-")
    cfg = base_train_config(exp, seed=0, run_dir=run_dir)
    cfg.steps, cfg.log_rollouts, cfg.checkpoint_every = a.steps, 0, 10 ** 6
    if a.decode_batch:
        cfg.sampling.batch_size = a.decode_batch
    if a.micro_batch:
        cfg.loss.micro_batch_size = a.micro_batch
    if a.update_engine:
        cfg.loss.engine = a.update_engine
    if a.test_timeout:
        cfg.sandbox = dataclasses.replace(cfg.sandbox, test_timeout_s=a.test_timeout)
    tasks = load_tasks("synthetic", split="val", n=a.tasks * a.steps, seed=0)
    policy = load_policy(cfg.policy)
    trainer = Trainer(cfg, policy=policy, train_tasks=tasks, eval_tasks=[], overwrite=True)
    mcfg = policy.model.config
    gflops_before = peak_gflops(mcfg)
    batches: list[list] = []
    reruns = _profile_reruns(trainer) if a.dense_share else None
    trainer.events.on("on_rollout", lambda trainer, step, rollouts: batches.append(list(rollouts)))
    t0 = time.time()
    rows = trainer.train(progress=False)
    wall = time.time() - t0
    trainer.close()
    digest = hashlib.sha256()  # the trained weights: runs that train alike end alike
    for name, t in sorted(policy.model.state_dict().items()):
        digest.update(name.encode() + t.detach().cpu().contiguous().numpy().tobytes())

    measured = list(zip(rows, batches))[1:]
    phases: dict[str, list[float]] = {}
    flops, kept, decoded_rows, prompt_tok, distinct = [], [], [], [], []
    if reruns is not None:  # the profiled reruns are not part of the step
        measured = [({**row, "time/step": row["time/step"] - s["extra_s"] - u["extra_s"],
                      "time/generate": row["time/generate"] - s["extra_s"],
                      "time/update": row["time/update"] - u["extra_s"]}, rollouts)
                    for (row, rollouts), s, u in zip(measured, reruns["sample"], reruns["update"])]
    for row, rollouts in measured:
        # prefill alone, on this step's distinct prompts
        prompts = list(dict.fromkeys(r.prompt for r in rollouts))
        enc = policy.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            tp = time.perf_counter()
            policy.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                         logits_to_keep=1)
            prefill = time.perf_counter() - tp
        P = [len(r.prompt_ids) for r in rollouts]
        T = [r.n_tokens for r in rollouts]
        Pd = [int(m.sum()) for m in enc.attention_mask]
        f_prefill = forward_flops(mcfg, sum(Pd), statistics.fmean(Pd) / 2, len(Pd))
        f_decode = sum(forward_flops(mcfg, t, p + t / 2, t) for p, t in zip(P, T))
        # the update's pass: each distinct prompt once (sequence_logprobs shares it across
        # the group's rows), then every row's completion against its prompt's context
        f_seq = f_prefill + f_decode
        f_update = f_seq * (1 if cfg.loss.kl_coef > 0 else 0) + 3 * f_seq * cfg.loss.epochs
        flops.append(f_prefill + f_decode + f_update)
        kept.append(sum(T))
        decoded_rows.append(len(T) * max(T))
        prompt_tok.append(sum(P))
        distinct.append(len({(r.task_id, r.code) for r in rollouts}))  # checks the sandbox ran
        for name, value in {
            "prefill": prefill, "decode": max(0.0, row["time/generate"] - prefill),
            "sandbox": row["time/execute"], "reward": row["time/reward"],
            "update_reference": row["time/update_reference"],
            "update_forward": row["time/update_forward"],
            "update_backward": row["time/update_backward"],
            "update_optimizer": row["time/update_optimizer"],
        }.items():
            phases.setdefault(name, []).append(value)
    step_s = statistics.fmean(r["time/step"] for r, _ in measured)
    gflops_after = peak_gflops(mcfg)
    gflops = max(gflops_before, gflops_after)
    floor_s = statistics.fmean(flops) / (gflops * 1e9)
    timeouts = statistics.fmean(r.get("exec/timeout", 0.0) * len(b) for r, b in measured)
    # Four significant figures, not three decimals: on a tiny batch the floor is a few ms and
    # rounding it to 0.001 s would make the printed ratio disagree with step_s / floor_s.
    out = {"step_s": _sig(step_s), "floor_s": _sig(floor_s),
           "ratio": round(step_s / floor_s, 2),
           "phases": {k: round(statistics.fmean(v), 3) for k, v in phases.items()},
           "flops": round(statistics.fmean(flops)), "matmul_gflops": round(gflops, 1),
           "matmul_gflops_before_after": [round(gflops_before, 1), round(gflops_after, 1)],
           "completion_tokens": round(statistics.fmean(kept)),
           "decode_positions_incl_padding": round(statistics.fmean(decoded_rows)),
           "prompt_tokens": round(statistics.fmean(prompt_tok)),
           "distinct_programs_per_step": round(statistics.fmean(distinct), 1),
           "timeouts_per_step": round(timeouts, 2), "test_timeout_s": cfg.sandbox.test_timeout_s,
           "batch": f"{a.tasks} tasks x {a.group} samples", "micro_batch": cfg.loss.micro_batch_size,
           "decode_batch": cfg.sampling.batch_size, "update_engine": cfg.loss.engine,
           "parallel_chunks": cfg.sampling.parallel_chunks, "sampler": cfg.sampling.sampler,
           "temperature": cfg.sampling.temperature,
           "measured_steps": len(measured),
           "threads": torch.get_num_threads(), "wall_s": round(wall, 1),
           "weights_digest": digest.hexdigest()[:16]}
    if reruns is not None:
        share = {k: statistics.fmean(r["share"] for r in v) for k, v in reruns.items()}
        bound = statistics.fmean(
            r["time/generate"] * share["sample"] + r["time/execute"] + r["time/reward"]
            + r["time/update"] * share["update"] for r, _ in measured)
        out.update({"dense_share": {k: round(v, 3) for k, v in share.items()},
                    "dense_bound_s": _sig(bound), "dense_bound_ratio": round(bound / floor_s, 2)})
    print(f"one step at {out['batch']} ({len(measured)} measured): {step_s:.2f} s; floor "
          f"{out['floor_s']} s ({out['flops'] / 1e9:.1f} GFLOP at {gflops:.1f} GFLOP/s, the better of "
          f"{gflops_before:.1f} before and {gflops_after:.1f} after the steps): ratio "
          f"{out['ratio']}")
    for k, v in out["phases"].items():
        print(f"  {k:<18} {v:7.3f} s")
    print(f"  completion tokens kept {out['completion_tokens']}, decode positions incl. "
          f"padding {out['decode_positions_incl_padding']}, prompt tokens {out['prompt_tokens']}")
    if reruns is not None:
        print(f"  dense kernels: {out['dense_share']['sample']:.0%} of sampling, "
              f"{out['dense_share']['update']:.0%} of the update; with every other operation "
              f"free the step would take {out['dense_bound_s']} s, ratio "
              f"{out['dense_bound_ratio']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

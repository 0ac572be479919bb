"""Counterfactual forks with prefix-cache reuse against naive regeneration.

One set of forks (parents sampled with :func:`~labkit.policy.rollout.sample_with_cache`,
positions from :func:`~labkit.policy.forking.choose_positions`, alternatives proposed once
by the EMA baseline) is continued greedily three ways, back to back in each of
``--repeats`` rounds (the order rotates):

* ``reuse``: :func:`~labkit.policy.forking.continue_forks` on the cache kept from sampling;
* ``rebuilt``: one :func:`~labkit.policy.forking.factual_cache` forward over the parents up
  to their last fork, then the same (for rollouts sampled without a cache);
* ``naive``: every fork re-encodes prompt + prefix (``continue_forks(kv=None)``).

Greedy decoding makes the three produce the same continuations up to floating-point ties;
``identical_fraction`` checks it. Prints a report, then as its last line a JSON object:
``wall_ratio`` (reuse / naive, the median over rounds; target <= 0.5),
``decode_bound_ratio`` (reuse's decode time alone / naive's wall: the ratio if its one-position
prefill were free, bounded by the continuation tokens each fork writes),
``recomputed_positions_ratio`` (prefix positions the current policy encodes again, reuse /
naive), the same two for ``rebuilt``, the fork count and the wall times.

    python -c "from labkit.bench.fork import main; main()" [--tasks 8 --group 2 ...]
    ... --hidden 1024 --layers 12 --heads 16      # a larger random model (cuda + bf16 if there)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from labkit.bench.rollout import add_model_args, bench_policy, repair_tasks
from labkit.policy import forking as fk
from labkit.policy.rollout import SamplingConfig, sample_with_cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit.bench.fork", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=2, help="completions per task (G)")
    parser.add_argument("--max-new-tokens", type=int, default=96,
                        help="the parents' length, and each fork's completion budget")
    parser.add_argument("--temperature", type=float, default=0.7, help="of the parents")
    parser.add_argument("--fraction", type=float, default=0.2, help="forks per completion step")
    parser.add_argument("--budget", type=int, default=32, help="most forks per parent")
    parser.add_argument("--fork-batch", type=int, default=64, help="forks per generate call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_model_args(parser)
    args = parser.parse_args(argv)

    policy, described = bench_policy(args)
    tok = policy.tokenizer
    tasks = repair_tasks(args.tasks)
    sampling = SamplingConfig(group_size=args.group, temperature=args.temperature,
                              max_new_tokens=args.max_new_tokens,
                              batch_size=args.tasks * args.group, seed=args.seed)
    t0 = time.perf_counter()
    parents, kv = sample_with_cache(policy, tasks, sampling)
    sample_s = time.perf_counter() - t0
    positions = fk.choose_positions(parents, fk.PositionConfig(fraction=args.fraction,
                                                               budget=args.budget, seed=args.seed))
    cfg = fk.ForkConfig.from_sampling(sampling, greedy=True, batch_size=args.fork_batch)
    t0 = time.perf_counter()
    proposals = fk.propose_alternatives(policy.baseline(), parents, positions, cfg, tok.pad_token_id)
    proposal_s = time.perf_counter() - t0
    prompt_tokens = [len(r.prompt_ids) for r in parents]
    print(f"model: {described}")
    print(f"{len(parents)} parents ({args.tasks} tasks x {args.group}), prompts "
          f"{min(prompt_tokens)}-{max(prompt_tokens)} tokens, {args.max_new_tokens} tokens each, "
          f"sampled with their cache in {sample_s:.2f} s")
    print(f"{len(proposals)} forks (fraction {args.fraction}, budget {args.budget}), "
          f"alternatives proposed by the baseline in {proposal_s:.2f} s, "
          f"{sum(p.alt != p.factual for p in proposals)} differ from the factual token")

    def reuse() -> fk.ForkBatch:
        return fk.continue_forks(policy, parents, proposals, cfg, kv=kv)

    def rebuilt() -> fk.ForkBatch:
        rows, positions_encoded = fk.factual_cache(policy.model, parents,
                                                   fk.cache_lengths(parents, proposals),
                                                   tok.pad_token_id, cfg.batch_size)
        batch = fk.continue_forks(policy, parents, proposals, cfg, kv=rows)
        batch.stats.recomputed_positions += positions_encoded
        return batch

    def naive() -> fk.ForkBatch:
        return fk.continue_forks(policy, parents, proposals, cfg, kv=None)

    ways = {"reuse": reuse, "rebuilt": rebuilt, "naive": naive}
    for k in (kv, None):  # warm-up: first-call allocations, outside the timings
        fk.continue_forks(policy, parents, proposals[:8], cfg, kv=k)
    walls: dict[str, list[float]] = {name: [] for name in ways}
    decode: dict[str, list[float]] = {name: [] for name in ways}
    batches: dict[str, fk.ForkBatch] = {}
    names = list(ways)
    for rep in range(args.repeats):
        for name in names[rep % 3:] + names[:rep % 3]:
            if policy.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            batches[name] = ways[name]()
            if policy.device.type == "cuda":
                torch.cuda.synchronize()
            walls[name].append(time.perf_counter() - t0)
            decode[name].append(batches[name].stats.decode_s)

    def same(name: str) -> float:
        pairs = zip(batches[name].forks, batches["naive"].forks)
        return sum(a.rollout.completion_ids == b.rollout.completion_ids for a, b in pairs) / max(
            len(proposals), 1)

    def wall_ratio(name: str) -> float:
        return statistics.median(w / n for w, n in zip(walls[name], walls["naive"]))

    def recomputed_ratio(name: str) -> float:
        return (batches[name].stats.recomputed_positions
                / max(batches["naive"].stats.recomputed_positions, 1))

    median = {name: statistics.median(w) for name, w in walls.items()}
    # What bounds reuse: with its prefill (one position per fork) free, a fork still writes
    # its continuation token by token. The bound is reuse's own decode time over naive's wall,
    # round by round; naive's decode beside it shows how much of that the shared prompt saves.
    bound = statistics.median(d / n for d, n in zip(decode["reuse"], walls["naive"]))
    for name, batch in batches.items():
        s = batch.stats
        print(f"{name:>8}: median {median[name]:.3f} s (runs "
              f"{', '.join(f'{w:.2f}' for w in walls[name])}); prefill {s.prefill_s:.2f} s, "
              f"decode {s.decode_s:.2f} s; recomputed {s.recomputed_positions} of "
              f"{s.prefix_positions} prefix positions; {s.generated_tokens} tokens generated")
    stats = batches["reuse"].stats
    result = {
        "bench": "fork",
        "forks": len(proposals),
        "parents": len(parents),
        "wall_ratio": round(wall_ratio("reuse"), 3),
        "recomputed_positions_ratio": round(recomputed_ratio("reuse"), 4),
        "identical_fraction": round(same("reuse"), 4),
        "reuse_wall_s": round(median["reuse"], 3),
        "naive_wall_s": round(median["naive"], 3),
        "rebuilt_wall_ratio": round(wall_ratio("rebuilt"), 3),
        "rebuilt_recomputed_positions_ratio": round(recomputed_ratio("rebuilt"), 4),
        "rebuilt_identical_fraction": round(same("rebuilt"), 4),
        "rebuilt_wall_s": round(median["rebuilt"], 3),
        "decode_bound_ratio": round(bound, 3),
        "reuse_decode_s": round(statistics.median(decode["reuse"]), 3),
        "naive_decode_s": round(statistics.median(decode["naive"]), 3),
        "prefix_positions": stats.prefix_positions,
        "generated_tokens": stats.generated_tokens,
        "proposal_s": round(proposal_s, 3),
        "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)],
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "model": described,
        "threads": torch.get_num_threads(),
    }
    print(f"bound: reuse's decode alone / naive's wall {result['decode_bound_ratio']} (the "
          f"continuation tokens: decode {result['reuse_decode_s']} s reuse, "
          f"{result['naive_decode_s']} s naive, medians)")
    print(f"reuse / naive: wall {result['wall_ratio']} (target <= 0.5), recomputed positions "
          f"{result['recomputed_positions_ratio']}, identical continuations "
          f"{result['identical_fraction']:.1%}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

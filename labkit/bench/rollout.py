"""Throughput of labkit's batched sampling against plain ``model.generate``.

Both draw the same completions (same prompts, batch, temperature, top-p, max new tokens,
stop strings and seed) in one process, back to back in each of ``--repeats`` rounds (the
order alternates), so that each round's ratio sees one machine load:

* labkit: :func:`labkit.policy.rollout.sample`, which also asks ``generate`` for the logits,
  computes the sampling log-probs, decodes, extracts the code and maps token offsets;
* plain: ``model.generate(...)`` returning the token ids only.

Tokens are completion tokens up to and including EOS (padding not counted). Prints a report,
then as its last line a JSON object: ``labkit_tokens_per_s`` and ``generate_tokens_per_s``
(over the median wall), ``ratio`` (the median over rounds of labkit's rate over plain's;
target >= 0.9), ``identical`` (the same tokens), the batch shape and the model.

    python -c "from labkit.bench.rollout import main; main()" [--tasks 8 --group 4 ...]
    ... --hidden 1024 --layers 12 --heads 16      # a larger random model (cuda + bf16 if there)

The model is ``data/models/tiny`` when it exists, else a random Llama of
:class:`~labkit.policy.tiny.TinyModelConfig`'s shape with a BPE of 1024 trained on
standard-library sources; the prompts are hand-written buggy functions of about 150-260
tokens in the plain repair format (:func:`repair_tasks`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import tempfile
import time
from dataclasses import replace

import torch

from labkit.env.records import BugSpan, RepairTask
from labkit.sandbox.records import TestSuite
from labkit.policy import tiny
from labkit.policy.loading import TINY_DIR, Policy, load_policy
from labkit.policy.prompts import build_prompt
from labkit.policy.rollout import SamplingConfig, sample, stop_token_ids, strip_completion

# ----------------------------------------------------------------------------- prompts

# (name, reference, (correct snippet, buggy snippet)): functions of the size HumanEval
# prompts have once the docstring is in, each with one realistic bug.
_FUNCTIONS: tuple[tuple[str, str, tuple[str, str]], ...] = (
    ("running_max", '''def running_max(values: list[int]) -> list[int]:
    """Return the running maximum of ``values``.

    The i-th element of the result is the largest of ``values[0..i]``. An empty
    list gives an empty list. Negative numbers are allowed.

    >>> running_max([1, 3, 2, 5, 4])
    [1, 3, 3, 5, 5]
    >>> running_max([-2, -5, -1])
    [-2, -2, -1]
    >>> running_max([])
    []
    """
    result = []
    best = None
    for value in values:
        if best is None or value > best:
            best = value
        result.append(best)
    return result
''', ("value > best", "value < best")),
    ("count_vowel_words", '''def count_vowel_words(sentence: str, min_length: int = 1) -> int:
    """Count the words of ``sentence`` that start with a vowel.

    Punctuation around a word and case are ignored; only words of at least
    ``min_length`` letters count.

    >>> count_vowel_words("An apple a day keeps the doctor away")
    4
    >>> count_vowel_words("Eat, or else!", min_length=3)
    2
    """
    count = 0
    for raw in sentence.split():
        word = raw.strip(".,;:!?\\"'()").lower()
        if len(word) < min_length or not word:
            continue
        if word[0] in "aeiou":
            count += 1
    return count
''', ('word[0] in "aeiou"', 'word[-1] in "aeiou"')),
    ("merge_intervals", '''def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals and return them sorted by start.

    Intervals that touch merge too: (1, 3) and (3, 5) give (1, 5).

    >>> merge_intervals([(5, 8), (1, 3), (2, 4)])
    [(1, 4), (5, 8)]
    >>> merge_intervals([])
    []
    """
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged
''', ("start <= merged[-1][1]", "start < merged[-1][1]")),
    ("digit_root", '''def digit_root(n: int, base: int = 10) -> int:
    """Repeatedly sum the digits of ``n`` in ``base`` until one digit is left.

    ``n`` is a non-negative integer; the digit root of 0 is 0. Digits are taken
    in the given base, which is at least 2.

    >>> digit_root(38)
    2
    >>> digit_root(0)
    0
    >>> digit_root(255, base=16)
    15
    """
    while n >= base:
        total = 0
        while n > 0:
            total += n % base
            n //= base
        n = total
    return n
''', ("total += n % base", "total += n // base")),
    ("group_by_length", '''def group_by_length(words: list[str]) -> dict[int, list[str]]:
    """Group ``words`` by their length, keeping the input order inside a group.

    Duplicates are kept. The keys of the result are the lengths that occur, in
    increasing order, so that printing the dictionary is deterministic.

    >>> group_by_length(["hi", "a", "yo", "abc"])
    {1: ['a'], 2: ['hi', 'yo'], 3: ['abc']}
    >>> group_by_length([])
    {}
    """
    groups: dict[int, list[str]] = {}
    for word in words:
        groups.setdefault(len(word), []).append(word)
    return {length: groups[length] for length in sorted(groups)}
''', ("for length in sorted(groups)", "for length in groups")),
    ("second_largest", '''def second_largest(numbers: list[int]) -> int | None:
    """Return the second largest distinct value of ``numbers``.

    Repeated values count once, so [5, 5, 3] gives 3. When there are fewer than
    two distinct values the result is None.

    >>> second_largest([4, 1, 7, 7, 3])
    4
    >>> second_largest([2, 2])
    >>> second_largest([])
    """
    first = second = None
    for x in numbers:
        if first is None or x > first:
            first, second = x, first
        elif x != first and (second is None or x > second):
            second = x
    return second
''', ("first, second = x, first", "first, second = x, second")),
    ("rle_encode", '''def rle_encode(text: str) -> list[tuple[str, int]]:
    """Run-length encode ``text`` into (character, count) pairs.

    Consecutive equal characters form one run; case matters and whitespace is a
    character like any other. The empty string encodes to an empty list.

    >>> rle_encode("aaabcc")
    [('a', 3), ('b', 1), ('c', 2)]
    >>> rle_encode("abA")
    [('a', 1), ('b', 1), ('A', 1)]
    >>> rle_encode("")
    []
    """
    runs: list[tuple[str, int]] = []
    for ch in text:
        if runs and runs[-1][0] == ch:
            runs[-1] = (ch, runs[-1][1] + 1)
        else:
            runs.append((ch, 1))
    return runs
''', ("runs[-1][1] + 1", "runs[-1][1]")),
    ("balanced", '''def balanced(text: str) -> bool:
    """Whether the brackets (), [] and {} in ``text`` are balanced.

    Other characters are ignored. Every closing bracket must match the most
    recent unclosed opening bracket of the same kind, and none may stay open.

    >>> balanced("f(a[1], {b: 2})")
    True
    >>> balanced("(]")
    False
    >>> balanced("((")
    False
    """
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack
''', ("return not stack", "return True")),
)


def repair_tasks(n: int) -> list[RepairTask]:
    """``n`` repair tasks cycling over the hand-written functions (ids differ per cycle)."""
    tasks = []
    for i in range(n):
        name, reference, (good, bad) = _FUNCTIONS[i % len(_FUNCTIONS)]
        buggy = reference.replace(good, bad, 1)
        line = reference[:reference.index(good)].count("\n") + 1
        tasks.append(RepairTask(
            task_id=f"bench/{name}/{i}", problem_id=f"bench/{name}", source="bench", prompt="",
            buggy_code=buggy, reference_code=reference, tests=TestSuite(), entry_point=name,
            bugs=(BugSpan(kind="hand", operator="hand", start_line=line, end_line=line),)))
    return tasks


# ----------------------------------------------------------------------------- the model


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The options that choose the benchmarked model (shared by the fork benchmark)."""
    d = tiny.TinyModelConfig()
    g = parser.add_argument_group("model")
    g.add_argument("--model", default="auto",
                   help="'auto' (data/models/tiny if present, else random), 'random', 'tiny', "
                        "or a local Hugging Face folder")
    g.add_argument("--hidden", type=int, help=f"random model: hidden size ({d.hidden_size})")
    g.add_argument("--layers", type=int, help=f"random model: layers ({d.num_hidden_layers})")
    g.add_argument("--heads", type=int, help=f"random model: attention heads ({d.num_attention_heads})")
    g.add_argument("--kv-heads", type=int, help="random model: key/value heads (= heads)")
    g.add_argument("--intermediate", type=int, help="random model: MLP width (8/3 hidden)")
    g.add_argument("--vocab", type=int, default=d.vocab_size, help="random model: BPE size")
    g.add_argument("--device", default="auto", help="'auto' (cuda if available), 'cpu', 'cuda'")
    g.add_argument("--dtype", default="auto", help="'auto' (bfloat16 on cuda, float32 on cpu)")
    g.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")


def _random_config(args: argparse.Namespace) -> tiny.TinyModelConfig:
    d = tiny.TinyModelConfig()
    hidden = args.hidden or d.hidden_size
    heads = args.heads or (d.num_attention_heads if args.hidden is None else max(1, hidden // 64))
    return tiny.TinyModelConfig(
        vocab_size=args.vocab, hidden_size=hidden, num_hidden_layers=args.layers or d.num_hidden_layers,
        num_attention_heads=heads, num_key_value_heads=args.kv_heads or heads,
        intermediate_size=args.intermediate or (d.intermediate_size if args.hidden is None
                                                else 8 * hidden // 3),
        max_position_embeddings=2048)


def _stdlib_corpus() -> list[str]:
    """Python source to train a code BPE on, from modules every Python ships."""
    names = ("bisect", "calendar", "difflib", "fractions", "heapq", "statistics", "string",
             "textwrap")
    return [inspect.getsource(importlib.import_module(name)) for name in names]


def bench_policy(args: argparse.Namespace) -> tuple[Policy, str]:
    """The policy to benchmark, and a one-line description of it."""
    if args.threads:
        torch.set_num_threads(args.threads)
    shaped = any(getattr(args, k) is not None for k in ("hidden", "layers", "heads", "kv_heads",
                                                        "intermediate"))
    spec = args.model
    if spec == "auto":
        spec = "tiny" if (TINY_DIR / "config.json").is_file() and not shaped else "random"
    if spec != "random":
        policy = load_policy(spec, device=args.device, dtype=args.dtype, reference="none")
        return policy, f"{spec} ({_params(policy)})"
    cfg = _random_config(args)
    tok = tiny.train_tokenizer(_stdlib_corpus(), vocab_size=cfg.vocab_size)
    with tempfile.TemporaryDirectory(prefix="labkit-bench-") as folder:
        tiny.save(tiny.init_model(tok, cfg), tok, folder)
        policy = load_policy(folder, device=args.device, dtype=args.dtype, reference="none")
    return policy, (f"random Llama hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
                    f"{cfg.num_attention_heads} heads, vocab {len(tok)} ({_params(policy)})")


def _params(policy: Policy) -> str:
    n = sum(p.numel() for p in policy.model.parameters())
    return f"{n / 1e6:.1f}M params, {policy.device}, {str(policy.dtype).removeprefix('torch.')}"


def _sync(policy: Policy) -> None:
    if policy.device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- the benchmark


def _plain_generate(policy: Policy, prompts: list[str], cfg: SamplingConfig) -> list[list[int]]:
    """What ``sample`` asks of ``generate``, minus its own work: ids only."""
    tok = policy.tokenizer
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
    torch.manual_seed(cfg.seed)
    seqs = policy.model.generate(
        **enc, do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens, pad_token_id=tok.pad_token_id,
        stop_strings=list(cfg.stop_strings) or None, tokenizer=tok)
    eos = stop_token_ids(policy.model, tok)
    return [strip_completion(row, tok.pad_token_id, eos)[0]
            for row in seqs[:, enc.input_ids.shape[1]:]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit.bench.rollout", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="completions per task (G)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    add_model_args(parser)
    args = parser.parse_args(argv)

    policy, described = bench_policy(args)
    tasks = repair_tasks(args.tasks)
    cfg = SamplingConfig(group_size=args.group, temperature=args.temperature, top_p=args.top_p,
                         max_new_tokens=args.max_new_tokens, batch_size=args.tasks * args.group,
                         seed=args.seed)
    prompts = [build_prompt(t, policy.tokenizer) for t in tasks for _ in range(args.group)]
    prompt_tokens = [len(policy.tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
    print(f"model: {described}")
    print(f"batch {len(prompts)} = {args.tasks} tasks x {args.group}, prompts "
          f"{min(prompt_tokens)}-{max(prompt_tokens)} tokens, {args.max_new_tokens} new tokens, "
          f"T={args.temperature}, top-p={args.top_p}")

    sample(policy, tasks[:1], replace(cfg, group_size=1, max_new_tokens=4))  # warm-up
    walls: dict[str, list[float]] = {"labkit": [], "generate": []}
    tokens: dict[str, list[list[int]]] = {}
    for rep in range(args.repeats):
        for name in (("labkit", "generate") if rep % 2 == 0 else ("generate", "labkit")):
            _sync(policy)
            t0 = time.perf_counter()
            if name == "labkit":
                ids = [r.completion_ids for r in sample(policy, tasks, cfg)]
            else:
                ids = _plain_generate(policy, prompts, cfg)
            _sync(policy)
            walls[name].append(time.perf_counter() - t0)
            tokens[name] = ids
    n_tokens = sum(map(len, tokens["labkit"]))
    median = {name: statistics.median(w) for name, w in walls.items()}
    # each repeat runs both back to back: their ratio sees the same machine load
    ratio = statistics.median(g / lab for g, lab in zip(walls["generate"], walls["labkit"]))
    for name, w in walls.items():
        print(f"{name:>8}: {n_tokens} tokens, median {median[name]:.3f} s "
              f"(runs {', '.join(f'{x:.2f}' for x in w)}) -> {n_tokens / median[name]:.0f} tokens/s")
    result = {
        "bench": "rollout",
        "labkit_tokens_per_s": round(n_tokens / median["labkit"], 1),
        "generate_tokens_per_s": round(n_tokens / median["generate"], 1),
        "ratio": round(ratio, 3),
        "identical": tokens["labkit"] == tokens["generate"],
        "batch": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "tokens": n_tokens,
        "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)],
        "repeats": args.repeats,
        "labkit_wall_s": [round(w, 4) for w in walls["labkit"]],
        "generate_wall_s": [round(w, 4) for w in walls["generate"]],
        "model": described,
        "threads": torch.get_num_threads(),
    }
    print(f"ratio labkit / generate = {result['ratio']} (target >= 0.9); "
          f"identical tokens: {result['identical']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

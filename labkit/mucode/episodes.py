"""Multi-turn repair episodes with public-test feedback, and multi-turn Best-of-N.

muCODE (arXiv 2502.20380) treats repair as a short episode::

    state_1 = problem + buggy program
    for turn t = 1..T:
        sample N candidate fixes from the generator given state_t
        pick one with a selector (random, public tests, learned verifier, or both)
        run it on the task's *public* tests (the docstring examples, or a designated subset)
        stop if they all pass
        state_{t+1} = problem + this attempt + feedback on the failed public tests
    reward = 1 if the final attempt passes the *hidden* tests, else 0

The public tests are ``RepairTask.public_tests`` (:mod:`labkit.env.tasks` fills them with the
examples shown in a synthetic prompt, or HumanEval's docstring examples, falling back to the
first third of the hidden cases). N = 1 with the ``random`` selector is a plain multi-turn
rollout; T = 1 is single-turn repair.

The prompt of turn t > 1 is the plain repair prompt (:mod:`labkit.policy.prompts`) with the
previous attempt in the ``### Buggy`` section and :func:`format_feedback`'s text in the
``### Feedback`` section::

    ### Fix the bug in this Python function.
    ### Problem
    <signature + docstring>
    ### Buggy
    <the previous attempt>
    ### Feedback
    Public tests: 1 of 3 passed.
    - f([9, 6]): expected 1 (int), got 0 (int)
    - f([]): raised ZeroDivisionError: division by zero
    ### Fixed

Each turn is kept as a :class:`Turn` (every candidate, its public and hidden verdicts, the
selector's scores and choice) and :func:`step_records` turns an episode into per-turn
thought/action steps with their return-to-go ``G_t`` (:func:`labkit.credit.anchors.returns_to_go`),
so step-level credit (DiDPO's ``A_D``) applies to multi-turn data.

A prompt that does not fit the model's context (``max_position_embeddings``) together with
``max_new_tokens`` is handled, never crashed on: the feedback is cut to its first line; if
the prompt still does not fit the episode ends at the previous turn (``stop = "context"``),
or, at turn 1, the episode is marked ``fits = False`` and holds no turn.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from labkit.credit.anchors import returns_to_go
from labkit.registry import Registry
from labkit.sandbox.records import Candidate, SandboxResult, TestSuite
from labkit.env.records import RepairTask
from labkit.sandbox.pool import default_sandbox
from labkit.policy.prompts import build_prompt
from labkit.policy.rollout import SamplingConfig, sample
from labkit.seeding import derive_seed

# ============================================================================= feedback text

FEEDBACK_HEADER = "Public tests: {passed} of {total} passed."
NO_PUBLIC_TESTS = "No public tests are available for this problem."


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())  # one line
    return text if len(text) <= n else text[: max(0, n - 3)] + "..."


def _call_text(suite: TestSuite, name: str, entry_point: str, max_chars: int) -> str:
    for case in suite.cases:
        if case.name == name:
            args = ", ".join(repr(a) for a in case.args)
            return _clip(f"{entry_point}({args})", max_chars)
    for test in suite.asserts:
        if test.name == name:
            first = next((ln.strip() for ln in test.source.splitlines() if ln.strip()), name)
            return _clip(first, max_chars)
    return name


def format_feedback(result: SandboxResult, suite: TestSuite, entry_point: str, *,
                    max_failures: int = 3, max_line_chars: int = 160,
                    max_chars: int = 600) -> str:
    """The feedback a failed attempt earns, from its run on the public tests.

    Layout (each line cut to ``max_line_chars``, the whole to ``max_chars``)::

        Public tests: {passed} of {total} passed.
        - {call}: {detail}          one line per failed test, at most max_failures
        - ... and {k} more failed.

    ``call`` is ``entry_point(args...)`` for a parent-graded case (the first source line
    for an assert test), ``detail`` the sandbox's verdict: ``expected X (type), got Y
    (type)`` or ``raised Error: message`` (the exception's last line). When the program did
    not load or run (syntax error, timeout) the second line is ``The program did not run:
    {error}`` instead of per-test lines.
    """
    if suite.total == 0:
        return NO_PUBLIC_TESTS
    lines = [FEEDBACK_HEADER.format(passed=result.passed, total=result.total)]
    failed = [o for o in result.outcomes if not o.ok]
    if result.passed == 0 and failed and all(o.detail == "not run" for o in failed):
        lines.append(_clip(f"The program did not run: {result.error}", max_line_chars))
    else:
        for o in failed[:max_failures]:
            call = _call_text(suite, o.name, entry_point, max_line_chars // 2)
            lines.append(_clip(f"- {call}: {o.detail or 'failed'}", max_line_chars))
        if len(failed) > max_failures:
            lines.append(f"- ... and {len(failed) - max_failures} more failed.")
        if not result.outcomes and not result.ok:
            lines.append(_clip(f"The program did not run: {result.error}", max_line_chars))
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def turn_task(task: RepairTask, previous_code: str | None) -> RepairTask:
    """The task as turn t > 1 shows it: the previous attempt in place of the buggy program
    (the original buggy program when the attempt is empty)."""
    if previous_code is None or not previous_code.strip():
        return task
    return dataclasses.replace(task, buggy_code=previous_code)


def turn_prompt(task: RepairTask, previous_code: str | None, feedback: str | None,
                tokenizer=None) -> str:
    """The prompt of one turn (turn 1: ``previous_code = feedback = None``)."""
    return build_prompt(turn_task(task, previous_code), tokenizer, feedback)


# ============================================================================= selectors


@dataclass(frozen=True)
class CandidateView:
    """What a selector may see of one candidate: its public-test verdict and, when a
    verifier is loaded, the verifier's score. Never the hidden tests, except the ``oracle``
    selector's ``hidden_ok``: a ceiling to compare selectors with, not a selector to deploy."""

    public_passed: int
    public_total: int
    verifier_score: float | None = None
    hidden_ok: bool | None = None

    @property
    def public_fraction(self) -> float:
        return self.public_passed / self.public_total if self.public_total else 0.0


Selector = Callable[[Sequence[CandidateView], random.Random], int]
SELECTORS: Registry[Selector] = Registry("selector")
NEEDS_VERIFIER = frozenset({"verifier", "public_then_verifier"})
READS_HIDDEN = frozenset({"oracle"})
"""Selectors shown the hidden-test verdict: controls, never a deployable selection."""


def _argmax(values: Sequence[float], among: Sequence[int]) -> int:
    """The first index of ``among`` with the largest value (candidates are exchangeable
    samples, so the first of a tie is as good as a random one)."""
    best = among[0]
    for i in among[1:]:
        if values[i] > values[best]:
            best = i
    return best


def _scores(cands: Sequence[CandidateView]) -> list[float]:
    if any(c.verifier_score is None for c in cands):
        raise ValueError("this selector needs verifier scores; pass a trained verifier "
                         "(labkit.mucode.verifier) to run_episodes")
    return [float(c.verifier_score) for c in cands]  # type: ignore[arg-type]


@SELECTORS.register("random")
def select_random(cands: Sequence[CandidateView], rng: random.Random) -> int:
    """``i ~ Uniform{0..N-1}``: distributed exactly like sampling a single candidate (N = 1)."""
    return rng.randrange(len(cands))


@SELECTORS.register("public_tests")
def select_public_tests(cands: Sequence[CandidateView], rng: random.Random) -> int:
    """``argmax_i passed_i / total_i`` on the public tests (first of ties)."""
    return _argmax([c.public_fraction for c in cands], list(range(len(cands))))


@SELECTORS.register("verifier")
def select_verifier(cands: Sequence[CandidateView], rng: random.Random) -> int:
    """``argmax_i r_phi(x, y_i)``, the learned verifier's score (first of ties)."""
    return _argmax(_scores(cands), list(range(len(cands))))


@SELECTORS.register("public_then_verifier")
def select_public_then_verifier(cands: Sequence[CandidateView], rng: random.Random) -> int:
    """Among the candidates with the highest public pass fraction, ``argmax r_phi``."""
    frac = [c.public_fraction for c in cands]
    top = max(frac)
    return _argmax(_scores(cands), [i for i, f in enumerate(frac) if f == top])


@SELECTORS.register("oracle")
def select_oracle(cands: Sequence[CandidateView], rng: random.Random) -> int:
    """A candidate that passes the hidden tests, when one does (first of them), else the public
    tests' choice: the ceiling of Best-of-N selection (a verifier that reads the hidden tests)."""
    if any(c.hidden_ok is None for c in cands):
        raise ValueError("the oracle selector needs hidden verdicts (run_episodes gives them)")
    ok = [i for i, c in enumerate(cands) if c.hidden_ok]
    return ok[0] if ok else select_public_tests(cands, rng)


# ============================================================================= records


@dataclass
class EpisodeConfig:
    """How episodes are run."""

    turns: int = 3
    """T: the most attempts per episode (1 = single-turn repair)."""
    n_candidates: int = 1
    """N: candidates sampled per turn (Best-of-N); 1 = a plain rollout."""
    selector: str = "random"
    """``random``, ``public_tests``, ``verifier`` or ``public_then_verifier``."""
    temperature: float = 0.7
    """Sampling temperature of the candidates: lower concentrates the N candidates on the
    policy's likeliest programs, leaving Best-of-N less diversity to choose from."""
    top_p: float = 1.0
    """Nucleus sampling of the candidates: keep the smallest set of tokens with this much
    probability (1 = the whole distribution)."""
    max_new_tokens: int = 160
    """Longest candidate completion in tokens; also reserved in the context: a turn's prompt
    plus this must fit ``max_position_embeddings``, or the feedback is cut to its first line
    and, failing that, the episode stops."""
    batch_size: int = 64
    """Sequences per ``generate`` call (tasks x N are chunked to fit): memory against speed."""
    max_failures_shown: int = 3
    """Failed public tests listed one per line in the feedback; the rest are summed up as
    ``- ... and k more failed.``"""
    feedback_max_chars: int = 600
    """Cap on a turn's whole feedback text in characters (each line is also cut at 160). Longer
    feedback tells the model more but takes context from the next prompt."""
    gamma: float = 0.95
    """Discount of the step return-to-go in :func:`step_records`."""
    seed: int = 0
    """Seeds the candidate sampling (derived per turn and call) and the ``random`` selector's
    picks (derived per task, rollout, turn and selector): a run repeated with the same seed,
    policy and tasks draws the same candidates and picks."""

    def validate(self) -> None:
        if self.turns < 1 or self.n_candidates < 1:
            raise ValueError("turns and n_candidates must be >= 1")
        if self.selector not in SELECTORS:
            raise ValueError(f"unknown selector {self.selector!r}; registered: {SELECTORS.names()}")


@dataclass
class Turn:
    """One turn: every candidate with its verdicts, and the one the selector kept."""

    turn: int
    prompt: str
    feedback_in: str | None
    """The feedback this turn's prompt showed (None at turn 1)."""
    candidates: list[str]
    completions: list[str]
    public: list[tuple[int, int]]
    """(passed, total) on the public tests, per candidate."""
    hidden_ok: list[bool]
    """Oracle verdict on the hidden tests, per candidate (for labels and analysis only;
    no selector sees it)."""
    scores: list[float | None]
    chosen: int
    feedback_out: str = ""
    """The feedback the chosen attempt earned (shown at the next turn)."""

    @property
    def code(self) -> str:
        return self.candidates[self.chosen]

    @property
    def thought(self) -> str:
        """The chosen completion's text outside its program (a chat model's reasoning;
        empty for the tiny model, which writes only code)."""
        comp, code = self.completions[self.chosen], self.code.strip()
        return comp.replace(code, "", 1).strip() if code and code in comp else ""

    @property
    def public_ok(self) -> bool:
        p, t = self.public[self.chosen]
        return t > 0 and p == t

    @property
    def passed(self) -> bool:
        return self.hidden_ok[self.chosen]


@dataclass
class Episode:
    task_id: str
    rollout: int
    turns: list[Turn] = field(default_factory=list)
    selector: str = "random"
    fits: bool = True
    stop: str = ""
    """``public_pass``, ``max_turns``, ``context`` (the next prompt did not fit) or
    ``no_fit`` (not even turn 1 fits)."""

    @property
    def reward(self) -> float:
        """``1`` if the final attempt passes the hidden tests, else ``0``."""
        return float(self.turns[-1].passed) if self.turns else 0.0

    @property
    def final_code(self) -> str:
        return self.turns[-1].code if self.turns else ""

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "rollout": self.rollout, "selector": self.selector,
                "fits": self.fits,
                "stop": self.stop, "reward": self.reward,
                "turns": [{**dataclasses.asdict(t), "public_ok": t.public_ok} for t in self.turns]}


def step_records(episode: Episode, gamma: float = 0.95) -> list[dict]:
    """Per-turn thought/action steps with their return-to-go.

    Step rewards are ``r_t = 0`` before the last turn and ``r_T = R`` (the hidden-test
    verdict of the final attempt), so ``G_t = sum_{k >= t} gamma^(k - t) r_k = gamma^(T - t) R``
    (:func:`labkit.credit.anchors.returns_to_go`). ``turn_passed`` is muCODE's single-step
    reward (does this turn's attempt pass the hidden tests).
    """
    n = len(episode.turns)
    rewards = [0.0] * (n - 1) + [episode.reward] if n else []
    out = []
    for t, (turn, r, g) in enumerate(zip(episode.turns, rewards, returns_to_go(rewards, gamma))):
        out.append({"task_id": episode.task_id, "rollout": episode.rollout,
                    "selector": episode.selector, "turn": t + 1,
                    "observation": turn.feedback_in or "", "thought": turn.thought,
                    "action": turn.code, "reward": r, "return_to_go": g,
                    "public_ok": turn.public_ok, "turn_passed": turn.passed})
    return out


# ============================================================================= the runner


SampleCache = dict
"""``{(task_id, rollout, turn, prompt): [(code, completion), ...]}``: candidates already
sampled for a state. Sharing one cache between runs with different selectors gives them
the same candidates wherever their states coincide (always at turn 1)."""


def _context_limit(policy) -> int | None:
    return getattr(policy.model.config, "max_position_embeddings", None)


def _n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def run_episodes(policy, tasks: Sequence[RepairTask], config: EpisodeConfig | None = None, *,
                 verifier=None, sandbox=None, rollouts_per_task: int = 1,
                 selectors: Sequence[str] | None = None,
                 cache: SampleCache | None = None) -> list[Episode]:
    """Run episodes for every task, every rollout index and every selector, all batched
    turn by turn (one ``generate`` batch and one sandbox batch per turn).

    ``selectors`` (default ``[config.selector]``) run side by side: episodes of the same task
    and rollout index share sampled candidates wherever their states (prompts) coincide,
    always at turn 1, so selectors are compared on common random numbers. Every distinct
    candidate is run once on the public and once on the hidden tests; ``verifier`` (a
    :class:`labkit.mucode.verifier.Verifier`) scores every candidate when given, and must be
    given for the verifier selectors. Episodes come out task by task, then rollout, then
    selector. Sampling is seeded from ``(config.seed, turn)``; the selector's random choices
    from ``(config.seed, task, rollout, turn, selector)``.
    """
    cfg = config or EpisodeConfig()
    cfg.validate()
    sels = list(selectors) if selectors else [cfg.selector]
    for sel in sels:
        if sel not in SELECTORS:
            raise ValueError(f"unknown selector {sel!r}; registered: {SELECTORS.names()}")
        if sel in NEEDS_VERIFIER and verifier is None:
            raise ValueError(f"selector {sel!r} needs a verifier; train one with "
                             "labkit.mucode.verifier.train_verifier or pick 'random'/'public_tests'")
    if sandbox is None:
        sandbox = default_sandbox()
    cache = {} if cache is None else cache
    tok = policy.tokenizer
    limit = _context_limit(policy)
    lanes = [(t, r, sel) for t in tasks for r in range(rollouts_per_task) for sel in sels]
    episodes = [Episode(t.task_id, r, selector=sel) for t, r, sel in lanes]
    task_of = [t for t, _, _ in lanes]
    prev: list[str | None] = [None] * len(episodes)
    fb: list[str | None] = [None] * len(episodes)
    active = list(range(len(episodes)))

    for turn in range(1, cfg.turns + 1):
        # -- prompts that fit ----------------------------------------------------------------
        prompts: dict[int, str] = {}
        for e in active:
            feedback = fb[e]
            prompt = turn_prompt(task_of[e], prev[e], feedback, tok)
            if limit and _n_tokens(tok, prompt) + cfg.max_new_tokens > limit and feedback:
                feedback = feedback.splitlines()[0]
                prompt = turn_prompt(task_of[e], prev[e], feedback, tok)
            if limit and _n_tokens(tok, prompt) + cfg.max_new_tokens > limit:
                episodes[e].stop = "context" if turn > 1 else "no_fit"
                episodes[e].fits = turn > 1
                continue
            fb[e] = feedback
            prompts[e] = prompt
        active = [e for e in active if e in prompts]
        if not active:
            break

        # -- sample N candidates per distinct state (cached) --------------------------------------
        key = {e: (task_of[e].task_id, episodes[e].rollout, turn, prompts[e]) for e in active}
        todo = list({key[e]: e for e in active if key[e] not in cache}.values())
        if todo:
            scfg = SamplingConfig(group_size=cfg.n_candidates, temperature=cfg.temperature,
                                  top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                                  batch_size=cfg.batch_size,
                                  seed=derive_seed(cfg.seed, "episode-sample", turn, len(cache)))
            rolls = sample(policy, [turn_task(task_of[e], prev[e]) for e in todo], scfg,
                           feedback=[fb[e] for e in todo])
            for j, e in enumerate(todo):
                group = rolls[j * cfg.n_candidates:(j + 1) * cfg.n_candidates]
                cache[key[e]] = [(r.code, r.completion) for r in group]

        # -- execute every distinct candidate on the public and the hidden tests -----------------
        jobs = list({(task_of[e].task_id, code): task_of[e]
                     for e in active for code, _ in cache[key[e]]}.items())
        pub_res = sandbox.run_many([Candidate(code, t.public_tests, t.entry_point,
                                              id=f"{t.task_id}:public") for (_, code), t in jobs])
        hid_res = sandbox.run_many([Candidate(code, t.tests, t.entry_point, id=t.task_id)
                                    for (_, code), t in jobs])
        pub = {k: r for (k, _), r in zip(jobs, pub_res)}
        hid = {k: r for (k, _), r in zip(jobs, hid_res)}
        score: dict = {}
        if verifier is not None:
            vals = verifier.score([t for _, t in jobs], [code for (_, code), _ in jobs])
            score = {k: v for (k, _), v in zip(jobs, vals)}

        # -- select, record, give feedback ------------------------------------------------------
        still = []
        for e in active:
            task = task_of[e]
            cands = cache[key[e]]
            ks = [(task.task_id, code) for code, _ in cands]
            reads_hidden = episodes[e].selector in READS_HIDDEN
            views = [CandidateView(pub[k].passed, task.public_tests.total, score.get(k),
                                   hid[k].ok if reads_hidden else None) for k in ks]
            rng = random.Random(derive_seed(cfg.seed, "select", task.task_id,
                                            episodes[e].rollout, turn, episodes[e].selector))
            chosen = SELECTORS.get(episodes[e].selector)(views, rng)
            t = Turn(turn=turn, prompt=prompts[e], feedback_in=fb[e],
                     candidates=[c for c, _ in cands], completions=[c for _, c in cands],
                     public=[(pub[k].passed, task.public_tests.total) for k in ks],
                     hidden_ok=[hid[k].ok for k in ks], scores=[score.get(k) for k in ks],
                     chosen=chosen)
            t.feedback_out = ("" if t.public_ok else
                              format_feedback(pub[ks[chosen]], task.public_tests,
                                              task.entry_point,
                                              max_failures=cfg.max_failures_shown,
                                              max_chars=cfg.feedback_max_chars))
            episodes[e].turns.append(t)
            if t.public_ok:
                episodes[e].stop = "public_pass"
            elif turn == cfg.turns:
                episodes[e].stop = "max_turns"
            else:
                prev[e], fb[e] = t.code, t.feedback_out
                still.append(e)
        active = still
    return episodes


def summarise(episodes: Sequence[Episode]) -> dict:
    """Flat metrics of a set of episodes (those that fit): ``pass/turn1`` (the first turn's
    chosen attempt passes the hidden tests: single-turn repair), ``pass/final`` (the
    episode's reward), ``turns/mean``, ``stop/<reason>`` fractions, and ``fit/fraction``."""
    fit = [e for e in episodes if e.fits and e.turns]
    n = max(1, len(fit))
    out = {"episodes": len(fit), "fit/fraction": len(fit) / max(1, len(episodes)),
           "pass/turn1": sum(e.turns[0].passed for e in fit) / n,
           "pass/final": sum(e.reward for e in fit) / n,
           "turns/mean": sum(len(e.turns) for e in fit) / n}
    for reason in ("public_pass", "max_turns", "context"):
        out[f"stop/{reason}"] = sum(e.stop == reason for e in fit) / n
    return out

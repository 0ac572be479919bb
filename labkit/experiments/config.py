"""What an experiment is configured by, and the training config it derives for each run.

:class:`ExperimentConfig` is the shared budget of every experiment (every method gets the
same); :func:`base_train_config` turns it into one run's :class:`TrainConfig`;
:func:`command` writes the command line that reproduces an experiment from its config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from labkit import provenance
from labkit.config import from_dict
from labkit.experiments import load
from labkit.loops.trainer import TrainConfig

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
"""The repository's results folder (``docs/results``): the published pages. An experiment
writes there only when asked (``out=docs/results``), and only from runs of one clean commit
(:func:`labkit.experiments.pages.write_page`)."""
class ReuseError(ValueError):
    """A results JSON named in ``reuse_recorded`` cannot stand for runs of this experiment; the
    message says what differs and what to do."""


DEFAULT_OUT = "runs/results"
"""Where an experiment's page goes by default, relative to the working directory."""


@dataclass
class ExperimentConfig:
    """Shared budget of an experiment (every method gets the same)."""

    METHOD_FIELDS: ClassVar[tuple[str, ...]] = ("methods",)
    """Fields that choose which methods run, not how any one of them trains (``methods`` is
    declared by each experiment's config; ``reuse_recorded`` compares everything else)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    """Training seeds; every method trains once per seed (``TrainConfig.seed``: sampling,
    task order). The tasks themselves come from ``task_seed``, the same for every run, so runs
    are compared paired; the 95% interval (seeds and tasks both random) covers training noise.
    A single seed measures no training noise: nothing is shown."""
    task_seed: int = 0
    """Seed of the training and held-out task lists (``tasks.seed``), fixed across seeds and
    methods: every run trains on the same problems and is evaluated on the same tasks."""
    train_split: str = "train"
    """Split trained on (``tasks.train_split``): ``train``, the shipped model's SFT templates
    (where it is strong and sure: few groups with signal), or ``val``, templates neither its
    SFT data nor ``test`` holds (room to learn). With ``val`` the paired evaluation also
    measures new instances of the trained templates (``paired_trained``)."""
    split: str = "test"
    """Held-out split evaluated on: ``test`` (templates training never saw), ``val``, or
    ``in_template`` (new instances of training templates)."""
    feedback: str = "dense"
    """Feedback regime of training (``feedback.mode``): dense, binary, public, noisy, coarse."""
    n_bugs: int = 1
    """Bugs per task (train and held-out); with 2-3, ``multi_hunk`` picks separable ones."""
    multi_hunk: bool = False
    """Only tasks whose bugs are separate, separately tested hunks (``tasks.multi_hunk``)."""
    paired_tasks: int = 200
    """After training: the start policy and every run's final checkpoint on these many
    held-out tasks of ``split`` (:mod:`labkit.experiments.paired`); the per-task changes give
    each seed's paired change. 0 = off."""
    paired_per_template: int | None = 12
    """At most this many of the ``paired_tasks`` from any one template, the list filled from
    further down the stream (:func:`labkit.env.balanced.balanced_tasks`). ``0`` or ``None``:
    the split's first tasks as drawn, where one ``test`` template is 28% of 200."""
    paired_k: int = 4
    """Samples per task at ``paired_temperature`` for the start policy and each run's final
    checkpoint: pass@1 is their mean pass rate. Each training seed has its own evaluation
    sampling seed, the same for its start and its end, so the start's sampling noise differs
    between seeds and the interval over seeds covers it."""
    paired_temperature: float = 0.7
    """Sampling temperature of the paired pass@1 (below training's: a less noisy reading of
    what the policy does)."""
    paired_pass_k: int = 8
    """pass@k at the *training* temperature, start and end on the same held-out list, beside
    pass@1 (a policy that only sharpens raises pass@1 and lowers pass@k). 0 = off."""
    paired_eval_seed: int = 4321
    """Base of the evaluation sampling seeds (one derived per training seed)."""
    screen_tasks: int = 0
    """The lower-noise evaluation beside the standard one (``paired_screened``,
    :func:`labkit.experiments.paired.add_screened`): at most this many held-out tasks whose
    start pass rate, screened with a sampling seed of its own, lies in ``screen_range``; each
    evaluated with ``screen_eval_k`` samples and adjusted by the screen's reading (a control
    variate). 0 = off."""
    screen_pool: int = 400
    """Held-out tasks screened (at most ``screen_per_template`` per template)."""
    screen_per_template: int | None = 24
    """At most this many of the screened pool from any one template (the ``test`` split has 32
    templates, so 12 cannot fill 400)."""
    screen_k: int = 4
    """Samples per task in the screen (the start policy, at ``paired_temperature``)."""
    screen_range: tuple[float, float] = (0.05, 0.95)
    """Screened start pass rates kept: tasks the start neither always nor never passes."""
    screen_eval_k: int = 6
    """Samples per kept task for pass@1 (against ``paired_k`` on the standard list)."""
    claim_on: str = "standard"
    """The evaluation the claim and its controls are read on: ``standard`` (the held-out
    list; without the tasks a trained-on reference solves when training used other templates)
    or ``screened`` (the ``screen_tasks`` list: held-out tasks the start neither always nor
    never solves, more samples each; another population, which the page names). Chosen before
    the run, as the claim is."""
    paired_trained: bool = True
    """With ``train_split`` ``val``: also evaluate start and end on ``paired_tasks`` new
    instances of the trained templates (``paired_trained``). Building that list runs the bug
    injection on a fresh stream of problems (minutes for two-bug tasks); ``False`` skips it."""
    steps: int = 40
    """Policy updates per run (``TrainConfig.steps``); a checkpoint every
    ``max(1, steps // 3)``. The learning rate is constant without warm-up, which lets an
    aliased method read a shorter budget off another experiment's longer finished run
    (:func:`finished_run`, ``prefix``)."""
    tasks_per_step: int = 16
    """16 tasks x 8 samples per update: smaller batches did not generalise to held-out
    tasks on the tiny model (docs/journal/results/probes)."""
    group_size: int = 8
    """G: completions sampled per task and update (``sampling.group_size``, the GRPO group;
    at most 320 new tokens). A larger group leaves fewer all-equal groups (zero
    advantage, no signal) at G times the sampling and sandbox cost per task."""
    temperature: float = 1.6
    """The training sampler's temperature (``sampling.temperature``). A hotter sampler leaves
    fewer all-equal groups on a sure model: at T = 1.6 the shipped model's groups on held-out
    templates are rarely all equal, at T = 1.0 about half are (docs/tiny_model.md)."""
    sampler: str = "race"
    """How the training sampler draws a token (``sampling.sampler``): ``race`` or
    ``inverse_cdf``, the same distribution at a fraction of the CPU time and another random
    stream (docs/journal/benchmarks.md)."""
    parallel_chunks: int = 2
    """Sampling chunks (64 rows) decoded at once, one per core, each from its own random stream
    (``sampling.parallel_chunks``; also every evaluation): it changes the random stream, so it
    is part of what reproduces a result."""
    lr: float = 5e-5
    """Peak AdamW learning rate (``optim.lr``), constant, no warm-up. 5e-5 moves the
    2M-parameter tiny model within tens of steps; a larger model wants far less."""
    eval_every: int = 20
    """Held-out pass@1 every N steps, plus step 0 and the last step
    (``TrainConfig.eval_every``): the points of the report's curves, and a budget read at step s
    needs one at s. 0 turns evaluation off and leaves the report nothing to read."""
    eval_tasks: int = 200
    """Held-out tasks of the synthetic ``test`` split (templates training never sees) at each
    evaluation (``tasks.eval_tasks``); an evaluation costs ``eval_tasks x eval_k`` samples."""
    eval_k: int = 4
    """Samples per held-out task at each evaluation, at T = 0.7 (``TrainConfig.eval_k``); pass@1
    is their mean pass rate. More samples narrow each reading's sampling noise at k times the
    evaluation cost."""
    train_problems: int = 2000
    """Synthetic training problems generated per run (``tasks.train_problems``, one buggy
    variant each); each step samples ``tasks_per_step`` of them."""
    out: str = DEFAULT_OUT
    """Folder the reports are written to: ``<name>.md``, ``.json``, ``.html`` and ``.png``.
    Publishing to the repository's pages is explicit: ``out=docs/results``."""
    run_root: str = "runs/experiments"
    """Root of the run folders: method ``m`` of experiment ``e`` trains into
    ``<run_root>/<e>/<m>/seed<seed>``, where finished runs are found again (``reuse_finished``)
    and aliased methods look for the other experiment's runs. Relative to the working directory."""
    policy: str = "tiny"
    """The starting policy (``policy.spec``): ``tiny`` or a local Hugging Face causal-LM folder.
    Every run keeps a KL reference (``reference: auto``, ``kl_coef`` 0.01)."""
    lora: bool = False
    """Train LoRA adapters (peft; ``PolicyConfig``'s rank, alpha and the architecture's default
    targets) instead of every weight: what a real checkpoint on a GPU trains. The KL reference
    is then the model with its adapters disabled; both engines train the same adapters."""
    report_to: str = "none"
    """Experiment trackers every run reports to (``TrainConfig.report_to``), comma-separated:
    tensorboard, wandb, mlflow, trackio, or none. Where a run is watched is not part of what
    it trains: runs reported elsewhere are reused and resumed alike."""
    engine: str = "labkit"
    """What trains each run: ``labkit`` (its own trainer) or ``trl`` (TRL's ``GRPOTrainer``,
    ``DiDPOTrainer`` for DiDPO: :mod:`labkit.experiments.trl_engine`), with the same methods,
    tasks, paired evaluation, statistics and page. A method the TRL engine cannot train is
    refused in one line before anything trains; its runs go to ``<run_root>/<e>-trl/``."""
    processes: int = 1
    """Processes the TRL engine trains each run on (``accelerate launch``; one: a plain child
    process). ``tasks_per_step x group_size`` must split over them. The labkit engine trains in
    one process."""
    page: str = ""
    """The page's name and its runs' folder under ``run_root``; empty: the experiment's own
    (reshaping names it by regime, the TRL engine adds ``-trl``). A second testbed or a pilot
    of an experiment sets one (``didpo-headroom``) and writes its page beside the main page
    instead of over it; its runs are never found again as the main page's."""
    reuse_finished: bool = True
    """Keep a run whose folder already holds a finished run of the same config: finished
    runs are not trained again, and an interrupted one resumes from its last checkpoint
    (:func:`prepare_run_dir`)."""
    allow_code_drift: bool = False
    """Let runs (finished, interrupted or recorded) trained by other code into this
    experiment: another commit or other uncommitted changes (:mod:`labkit.provenance`). Off,
    such a run is refused with one line naming the difference; on, it is used and the page's
    header says which code each row comes from."""
    smoke: bool = False
    """A smoke run (``experiment NAME --smoke``): the experiment's tiny budget (its ``SMOKE``
    overrides), the whole pipeline in minutes; its page says its numbers decide nothing."""
    reuse_recorded: str | None = None
    """An earlier results JSON of the same experiment (e.g. ``docs/results/reshaping.json``):
    a method it records with every seed asked for, made with this same config (the seeds, the
    fields that pick methods, where reports and runs go and how runs are watched aside) from
    the same starting weights,
    is taken from it instead of trained again, its per-task paired changes included, so new
    methods are compared task by task with it (:func:`labkit.experiments.runs.recorded_methods`).
    Runs found in ``run_root`` come first."""

    def validate(self) -> None:
        if self.claim_on not in CLAIM_ON:
            raise ValueError(f"claim_on must be one of {', '.join(CLAIM_ON)}, not {self.claim_on!r}")
        if self.claim_on == "screened" and not (self.screen_tasks and self.paired_tasks):
            raise ValueError("claim_on=screened reads the claim on the screened list: set "
                             "screen_tasks (e.g. 80) and keep paired_tasks above 0")


CLAIM_ON = ("standard", "screened")
"""The evaluations a claim may be read on (``ExperimentConfig.claim_on``;
:func:`labkit.experiments.claims.primary_key`)."""


SYNTHETIC_TEST_TIMEOUT_S = 0.25
"""The experiments' per-test wall limit (``sandbox.test_timeout_s``; the sandbox's default
is 1 s). Synthetic references run in microseconds (all 1,463 of the val, test and two-bug
val sets pass at it); at 1 s the one looping candidate most steps hold made the sandbox phase
0.9 s of a 3.2 s step, at 0.25 s 0.42 s (docs/journal/benchmarks.md)."""


def base_train_config(exp: ExperimentConfig, seed: int, run_dir: str) -> TrainConfig:
    """The training config of one run of ``exp`` (seed ``seed``, folder ``run_dir``)."""
    return from_dict(TrainConfig, {
        "run_dir": run_dir, "seed": seed, "steps": exp.steps, "tasks_per_step": exp.tasks_per_step,
        "policy": {"spec": exp.policy, "reference": "auto", "lora": exp.lora},
        "sampling": {"group_size": exp.group_size, "temperature": exp.temperature, "max_new_tokens": 320,
                     "sampler": exp.sampler, "parallel_chunks": exp.parallel_chunks},
        "tasks": {"source": "synthetic", "train_problems": exp.train_problems,
                  "train_split": exp.train_split, "eval_split": exp.split,
                  "eval_tasks": exp.eval_tasks, "seed": exp.task_seed, "n_bugs": exp.n_bugs,
                  "multi_hunk": exp.multi_hunk},
        "feedback": {"mode": exp.feedback},
        "sandbox": {"test_timeout_s": SYNTHETIC_TEST_TIMEOUT_S},
        "loss": {"kl_coef": 0.01, "micro_batch_size": 32},
        "optim": {"lr": exp.lr},
        "eval_every": exp.eval_every, "eval_k": exp.eval_k, "eval_temperature": 0.7,
        "checkpoint_every": max(1, exp.steps // 3), "log_rollouts": 16,
        "report_to": exp.report_to,
    })


NOT_IN_COMMAND = ("reuse_recorded", "allow_code_drift", "smoke", "run_root")
"""Fields the rerun command leaves out: it rebuilds every row from nothing (a record the rows
were taken from is named as their source, never as the command; where the runs were kept,
``run_root``, is a path of the machine that trained them), and ``smoke`` is ``--smoke``."""


def command(name: str, exp) -> str:
    """The command that rebuilds every row of experiment ``name`` with config ``exp``:
    ``python -m labkit experiment NAME [--smoke] --set k=v ...`` for every field that differs
    from the experiment's defaults (or from its ``SMOKE`` budget, for a smoke run; values
    written as the ``--set`` parser, YAML, reads them back), :data:`NOT_IN_COMMAND` aside."""
    import shlex

    default = smoke_config(load(name), type(exp)) if getattr(exp, "smoke", False) else type(exp)()
    parts = [f"python -m labkit experiment {name}" + (" --smoke" if getattr(exp, "smoke", False) else "")]
    for f in dataclasses.fields(exp):
        ours = getattr(exp, f.name)
        if f.name not in NOT_IN_COMMAND and ours != getattr(default, f.name):
            parts.append("--set " + shlex.quote(f"{f.name}={_yaml_value(ours)}"))
    return " ".join(parts)


def smoke_config(module, cls=None):
    """The experiment's config at its smoke budget: its ``Config`` with the module's ``SMOKE``
    overrides and ``smoke`` on."""
    cfg = (cls or module.Config)()
    for k, v in getattr(module, "SMOKE", {}).items():
        setattr(cfg, k, v)
    cfg.smoke = True
    return cfg


def _yaml_value(v) -> str:
    """``v`` in YAML flow style with no spaces between list items (``[0,1,2]``, ``null``)."""
    import yaml

    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_yaml_value(x) for x in v) + "]"
    return yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix("\n...")


def code_commit() -> str | None:
    """The checkout's commit, with ``+dirty.<hash>`` when the files that decide a run differ
    from it (:func:`labkit.provenance.label`), or ``None`` outside a git checkout."""
    ident = provenance.code_identity()
    return provenance.label(ident) if ident["commit"] else None

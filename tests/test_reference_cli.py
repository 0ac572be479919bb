"""The reference documents the command line: every command and every flag of its argument
parser is in docs/reference.md; ``experiment --help`` names every experiment; ``eval`` has one
default temperature; the docs give the paths the trackers write."""

import argparse
import re
from pathlib import Path

from labkit.__main__ import OWN_PARSERS, build_parser, eval_config

ROOT = Path(__file__).resolve().parents[1]


def _commands(parser: argparse.ArgumentParser, path: str = ""):
    """(command, parser) of every command under ``parser``, walked here on its own (not with
    the generator's walker), own-parser commands with their own parser."""
    import importlib

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                command = f"{path} {name}".strip()
                if name in OWN_PARSERS:
                    sub = importlib.import_module(OWN_PARSERS[name]).build_parser()
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from _commands(sub, command)
                else:
                    yield command, sub


def _section(page: str, command: str) -> str:
    """The reference's section of ``command`` (up to the next heading)."""
    start = page.index(f"### `{command}`\n")
    end = page.find("\n#", start + 1)
    return page[start:end if end > 0 else None]


def test_every_command_and_flag_is_in_the_reference():
    page = (ROOT / "docs" / "reference.md").read_text()
    cli = page[page.index("## Command line"):]
    commands = dict(_commands(build_parser()))
    assert {"train", "eval", "runs", "experiment", "tasks validate", "sandbox run", "paired",
            "docs", "lab", "mucode", "pretrain-tiny"} <= set(commands)
    missing = []
    for command, parser in commands.items():
        if f"### `{command}`\n" not in cli:
            missing.append(command)
            continue
        section = _section(cli, command)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = action.option_strings or [action.dest]
            missing += [f"{command} {n}" for n in names if not re.search(rf"`{re.escape(n)}[ `]", section)]
    assert not missing, missing
    train = _section(cli, "train")
    assert "--overwrite" in train and "--quiet" in train and "--resume RUN_DIR" in train


def test_experiment_help_names_every_experiment():
    from labkit.experiments import EXPERIMENTS

    parser = dict(_commands(build_parser()))["experiment"]
    text = parser.format_help()
    assert all(name in text for name in EXPERIMENTS), text


def test_eval_has_one_default_temperature():
    from labkit.loops.config import TrainConfig
    from labkit.policy.evaluate import EvalConfig

    cfg = eval_config(build_parser().parse_args(["eval"]))
    assert cfg == EvalConfig() and cfg.temperature == TrainConfig().eval_temperature
    assert eval_config(build_parser().parse_args(["eval", "--temperature", "1.0"])).temperature == 1.0


def test_the_docs_give_the_folders_the_trackers_write():
    """tests/test_trackers.py reads W&B's run under trackers/wandb/wandb/offline-run-*."""
    training = (ROOT / "docs" / "training.md").read_text()
    assert "`wandb sync <run>/trackers/wandb/wandb/offline-run-*`" in training
    assert "`<run>/trackers/tensorboard/`" in training and "trackers/mlflow/mlflow.db" in training

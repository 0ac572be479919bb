"""Floor 4, beside ``runs``: adapters that run labkit's parts inside other trainers.

``labkit.integrations.trl``: tasks, sandbox rewards and DiDPO credit in TRL's
``GRPOTrainer``; ``labkit.integrations.verl``: a custom reward function and the parquet
dataset for verl. The trainers are optional dependencies, imported only by these modules.
"""

TRL_LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}
"""labkit's loss aggregations (``loss.agg``) that TRL has, by TRL's ``loss_type`` name for the
same normalisation (the experiments' TRL engine refuses the others)."""

"""labkit: a notebook lab for training code-repair language models with RL."""

__version__ = "0.1.0"

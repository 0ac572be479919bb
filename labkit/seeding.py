"""One seeding helper for the whole lab.

``seed_everything(seed, offset)`` seeds Python's ``random``, numpy and torch (when they
are installed), and returns a ``random.Random`` for code that wants its own stream (bug
injection, task sampling, sandbox ordering). ``offset`` separates processes of a
data-parallel run (rank) the way nanoGPT's ``1337 + seed_offset`` does.
"""

from __future__ import annotations

import hashlib
import os
import random


def derive_seed(seed: int, *names: object) -> int:
    """A stable 31-bit seed derived from ``seed`` and names (independent of PYTHONHASHSEED)."""
    h = hashlib.blake2b(repr((seed, *names)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF


def seed_everything(seed: int, offset: int = 0, *, deterministic_torch: bool = False) -> random.Random:
    s = int(seed) + int(offset)
    random.seed(s)
    os.environ.setdefault("PYTHONHASHSEED", str(s))
    try:
        import numpy as np

        np.random.seed(s % 2**32)
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.manual_seed(s)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(s)
        if deterministic_torch:
            torch.use_deterministic_algorithms(True, warn_only=True)
    return random.Random(s)

"""Floor 5, muCODE (arXiv 2502.20380): multi-turn repair episodes with public-test feedback
and Best-of-N (:mod:`.episodes`), a learned verifier (:mod:`.verifier`) and expert iteration
(:mod:`.loop`). A loop of its own beside the GRPO trainer (:mod:`labkit.loops`), which it never
imports: both write run folders (:mod:`labkit.runs`), emit events and draw nothing.
"""

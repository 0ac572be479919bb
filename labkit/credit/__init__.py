"""Floor 3, credit: reshaping, advantages, diff anchors and losses (pure functions).

Importing the package registers every advantage estimator (``grpo``, ``dr_grpo``,
``rloo``, ``batch_norm``, the DiDPO family, ``didpo_fork`` and the ``oracle_hunk``
controls) and policy loss. :mod:`labkit.credit.pipeline` is the one path from feedback
components to token advantages.
"""

from labkit.credit import advantages, anchors, fork_credit, losses, oracle  # noqa: F401  (registration)

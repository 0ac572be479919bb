"""Floor 3, credit: reshaping, advantages, diff anchors and losses (pure functions).

Importing the package registers every advantage estimator (``grpo``, ``dr_grpo``,
``rloo``, ``batch_norm``, the DiDPO family and ``didpo_fork``) and policy loss.
"""

from labkit.credit import advantages, anchors, fork_credit, losses  # noqa: F401  (registration)

"""Floor 3, credit: reshaping, advantages, diff anchors and losses (pure functions).

Importing the package registers every advantage estimator (``grpo``, ``dr_grpo``,
``rloo``, ``batch_norm`` and the DiDPO family) and policy loss.
"""

from labkit.credit import advantages, anchors, losses  # noqa: F401  (registration)

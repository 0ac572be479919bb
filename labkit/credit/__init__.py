"""Floor 3, credit: reshaping, advantages, diff anchors and losses (pure functions)."""

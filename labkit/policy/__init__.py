"""Floor 2, the policy: loading, rollouts, counterfactual forking."""

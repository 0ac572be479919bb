"""Floor 5, loops: the GRPO trainer (:mod:`.trainer`), its config, the rollout stages an
estimator's needs switch on, checkpoints and resume. It emits events and draws nothing; its
run folders and trackers are :mod:`labkit.runs`'."""

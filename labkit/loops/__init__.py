"""Floor 4, loops: trainer, multi-turn episodes, verifier. They emit events and draw nothing."""

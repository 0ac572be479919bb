"""Training data of the shipped tiny model's supervised warm-up (:mod:`labkit.policy.pretrain`):
renamed copies of its SFT templates (:mod:`.augment`) and generated programs of random shapes
(:mod:`.generated`). Only the pretraining reads them; the environment floor holds the repair
tasks the lab trains and evaluates on."""

"""Floor 1, the environment: repair tasks, bug injection, task sampling and feedback signals.

Programs run in the sandbox, the floor below (:mod:`labkit.sandbox`). Nothing in this floor
imports torch; it can be used (and tested) on its own.
"""

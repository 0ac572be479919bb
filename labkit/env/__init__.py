"""Floor 1, the environment: repair tasks, bug injection, the sandbox and feedback signals.

Nothing in this floor imports torch; it can be used (and tested) on its own.
"""

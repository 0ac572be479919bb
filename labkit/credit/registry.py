"""The credit floor's registries use the one registry type of the ground floor
(:class:`labkit.registry.Registry`); this name is kept for imports."""

from labkit.registry import Registry

__all__ = ["Registry"]

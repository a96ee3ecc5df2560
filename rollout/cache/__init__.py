"""The content-addressed generation cache (docs/cache.md)."""

from rollout.cache.store import CACHE_VERSION, GenerationCache, row_key

__all__ = ["CACHE_VERSION", "GenerationCache", "row_key"]

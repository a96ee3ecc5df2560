"""Pieces of the embedded CPU engine: weights cache, batch-invariant Llama forward, sampler."""

"""Eval sweeps: one spec, a grid of jobs (cells), one report (docs/sweeps.md)."""

"""Determinism audits: compare two runs, re-check a sample of one, repeat a job across topologies."""

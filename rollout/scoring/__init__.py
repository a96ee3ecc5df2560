"""Scores for generated rows: rewards for RL rollouts, metrics for evals (docs/scoring.md)."""

from rollout.scoring.base import Score, Scorer, ScoreRow
from rollout.scoring.registry import SCORERS, scorer

__all__ = ["SCORERS", "Score", "ScoreRow", "Scorer", "scorer"]

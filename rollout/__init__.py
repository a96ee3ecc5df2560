"""rollout: offline, deterministic rollouts for DeepInfer, with an embedded CPU engine."""

__version__ = "0.1.0"

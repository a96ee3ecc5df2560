"""Stand-in for deep_select, one of the kernel libraries DeepInfer's build script builds."""

__version__ = "0.0.0+fake"

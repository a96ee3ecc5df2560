"""Reading prompts (sources, prompt rendering) and writing generations (sink)."""

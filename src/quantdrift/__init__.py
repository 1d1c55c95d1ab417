"""quantdrift: a streaming guard for quantized LLM rollouts."""

__version__ = "0.1.0"

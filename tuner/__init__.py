"""tuner — a Bayesian auto-tuner for vLLM serving."""

__version__ = "0.1.0"

"""adwin: adaptive-window controller for on-policy distillation."""

__version__ = "0.1.0"

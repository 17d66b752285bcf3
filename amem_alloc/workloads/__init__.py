"""Allocation patterns of real workloads, as sequences of (action, tensor id, bytes, stream)."""
from .training import training_events

__all__ = ["training_events"]

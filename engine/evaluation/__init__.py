"""Evaluation of the built-in model against the simulator's ground truth."""

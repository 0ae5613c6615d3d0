"""A game world's evaluation: episodes against the env, metrics, objects, sheets."""

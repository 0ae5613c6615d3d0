"""The Matrix-Game 2.0 family (keys and mouse, GPU): backend, stages, attention, save state."""

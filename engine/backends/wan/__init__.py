"""The causal Wan 2.1 family (text to video, GPU)."""

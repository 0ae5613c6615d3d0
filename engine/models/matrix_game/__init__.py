"""Matrix-Game 2.0 (SkyworkAI, MIT): an image-to-world causal DiT on Wan2.1-1.3B's blocks with
keyboard and mouse action modules, written here from the public code and report.

``config`` (the published configurations and the three variants), ``conditions`` (keys and
mouse to the model's per-frame inputs and their windows), ``action_module``,
``transformer`` (the chunk forward through the paged KV cache), ``image_encoder`` (the CLIP
ViT-H/14 visual tower), ``loading`` (the published checkpoint layout).
"""

"""The game world model: each next frame predicted as one of the game's palette colours per
pixel, from the last frames and the held actions (``unet``), over the colours a recording
shows (``palette``)."""

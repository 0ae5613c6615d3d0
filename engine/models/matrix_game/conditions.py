"""Keys and mouse to Matrix-Game's action inputs: per raw (video) frame a keyboard vector and a
mouse (pitch, yaw) velocity, and per latent frame the window of raw frames its action modules
read.

The raw frames of a stream: frame 0 is latent frame 0's only one, raw frames ``4j-3..4j``
belong to latent frame ``j >= 1`` (the Wan VAE's 1 + 4 (F - 1) frames). Latent frame ``j``
reads the 12 raw frames ``4j-12 .. 4j-1`` (``ratio * windows_size``), those before the stream
replaced by raw frame 0: the left padding of the published model. A stream's first chunk of
3 latent frames is 9 raw frames, every later chunk 12.
"""

from __future__ import annotations

import torch

from worldstream.engine.models.matrix_game.config import CAMERA_KEY_SPEED, Variant


def raw_inputs(variant: Variant, controls: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's per-frame inputs of the engine's action vectors.

    Args:
        variant: the model variant (its key order and inputs).
        controls: ``(N, len(variant.keys) [+ 2])`` float: the held keys as a multi-hot over
            ``variant.keys``, then, where the page's mouse steers it (``variant.pointer``), the
            pointer motion ``(x, y)`` in model units (y already signed so that up is
            positive: ``engine.core.action_space.ActionSpace.mouse_scale``).
    Returns:
        ``keyboard`` ``(N, keyboard_dim)`` and ``mouse`` ``(N, 2)`` (pitch, yaw; None for a
        model without a mouse input), float32.
    Raises:
        ValueError: controls of another width.
    """
    width = len(variant.keys) + (2 if variant.pointer else 0)
    if controls.ndim != 2 or controls.shape[1] != width:
        raise ValueError(f"{variant.name} takes {width} controls per frame, got "
                         f"{tuple(controls.shape)}")
    c = controls.float()
    hot = {k: c[:, i] for i, k in enumerate(variant.keys)}
    if variant.name == "templerun":
        # one-hot of 7: index 0 is "no action", the others in the published order
        keys = torch.stack([hot[k] for k in variant.keys], 1)
        idle = (keys.sum(1, keepdim=True) == 0).float()
        return torch.cat([idle, keys], 1), None
    if variant.name == "gta_drive":
        # W/S drive; A/D steer, as the mouse's yaw (the upstream demo's camera keys)
        keyboard = torch.stack([hot["forward"], hot["back"]], 1)
        yaw = CAMERA_KEY_SPEED * (hot["right"] - hot["left"])
        return keyboard, torch.stack([torch.zeros_like(yaw), yaw], 1)
    keyboard = torch.stack([hot[k] for k in ("forward", "back", "left", "right")], 1)
    pitch = CAMERA_KEY_SPEED * (hot["look_up"] - hot["look_down"]) + c[:, -1]
    yaw = CAMERA_KEY_SPEED * (hot["look_right"] - hot["look_left"]) + c[:, -2]
    return keyboard, torch.stack([pitch, yaw], 1)


def chunk_raw_frames(controls: torch.Tensor, latent_frames: int, first: bool,
                     ratio: int = 4) -> torch.Tensor:
    """The raw frames of a chunk among its shown frames' controls ``(T, C)``: all of them
    (``ratio * latent_frames``), or for a stream's first chunk the last ``1 + ratio
    (latent_frames - 1)`` (its first shown frames repeat raw frame 0)."""
    need = 1 + ratio * (latent_frames - 1) if first else ratio * latent_frames
    if controls.shape[0] < need:
        raise ValueError(f"a chunk of {latent_frames} latent frames needs {need} frames of "
                         f"controls, got {controls.shape[0]}")
    return controls[-need:]


def action_windows(history: torch.Tensor | None, raw: torch.Tensor, latent_frames: int,
                   window: int = 12, ratio: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Each latent frame's window of raw frames, and the history for the next chunk.

    Args:
        history: ``(B, window, C)``: the ``window`` raw frames before the chunk (left-padded
            with raw frame 0), or None for a stream's first chunk.
        raw: ``(B, R, C)``: the chunk's raw frames (:func:`chunk_raw_frames`): ``R = 1 + ratio
            (latent_frames - 1)`` for a first chunk, ``ratio * latent_frames`` after.
        latent_frames: latent frames of the chunk.
    Returns:
        ``windows`` ``(B, latent_frames, window, C)`` (latent frame ``i`` of the chunk reads the
        ``window`` raw frames before its last one) and the next ``history`` ``(B, window, C)``.
    """
    first = history is None
    if first:
        history = raw[:, :1].expand(-1, window, -1)
    expected = 1 + ratio * (latent_frames - 1) if first else ratio * latent_frames
    if raw.shape[1] != expected:
        raise ValueError(f"{latent_frames} latent frames take {expected} raw frames, got "
                         f"{raw.shape[1]}")
    seq = torch.cat([history, raw], 1)
    # the chunk's raw frame that ends latent frame i: 4i in a first chunk (raw frame 0 is
    # latent 0 alone), 4i + 3 after; its window is the `window` raw frames before it
    ends = [ratio * i + (0 if first else ratio - 1) for i in range(latent_frames)]
    windows = torch.stack([seq[:, e:e + window] for e in ends], 1)
    return windows, seq[:, -window:].clone()

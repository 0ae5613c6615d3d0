"""Warm-starting a :class:`WorldDiT` from a trained one whose inputs or depth differ."""

from __future__ import annotations

import torch

from worldstream.engine.models.builtin.world_dit import WorldDiT


def warm_start(model: WorldDiT, state: dict[str, torch.Tensor]) -> None:
    """Load ``state`` (a trained :class:`WorldDiT`'s ``state_dict``) into ``model``; a model
    with ``skip_source`` or ``pose_path`` warm-started from one without gets the stem's
    second-source input channels, the skip's mixing map and the pose embedding's outputs at
    zero, so it starts as exactly the trained model (as ControlNet's zero convolutions add a
    condition to a trained network); a deeper model keeps its extra blocks, after the trained
    ones, as initialised (adaLN-Zero: each adds nothing until trained, so the deeper model
    also starts as the trained one). RuntimeError or ValueError when the shapes differ
    otherwise (a shallower model included)."""
    stem = state.get("stem.weight")
    own = model.stem.weight
    if stem is not None and stem.shape != own.shape:
        extra = own.shape[1] - stem.shape[1]
        if not model.config.skip_source or extra != model.config.latent_channels:
            raise ValueError(f"stem {tuple(stem.shape)} does not fit {tuple(own.shape)}")
        pad = torch.zeros(stem.shape[0], extra, *stem.shape[2:], dtype=stem.dtype)
        state = {**state, "stem.weight": torch.cat([stem, pad], dim=1)}
    # parts the trained model has not, kept as initialised (zero outputs: no change)
    trained = {int(k.split(".")[1]) for k in state if k.startswith("blocks.")}
    blocks = [f"blocks.{i}" for i in range(len(model.blocks)) if trained and i > max(trained)]
    modules = dict(model.named_modules())
    for name in ("skip_gate", "pose_emb", *blocks):
        part = modules.get(name)
        if part is not None and not any(k.startswith(f"{name}.") for k in state):
            state = {**state, **{f"{name}.{k}": v.clone() for k, v in part.state_dict().items()}}
    model.load_state_dict(state)

"""A trained game world on disk and in memory: the U-Net, the palette, the key map, the env.

Folder layout (diffusers' ``save_pretrained`` for the network)::

    DIR/unet/config.json, DIR/unet/diffusion_pytorch_model.safetensors
    DIR/world.json   env id, frame size, palette, action meanings, change weight
    DIR/keymap.json  the page's keys (engine.worlds.game.keymap)
    DIR/MODEL_CARD.md
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from worldstream.engine.core.reader import MAX_META_BYTES, read_json_file
from worldstream.engine.models.game.palette import Palette
from worldstream.engine.models.game.unet import GameUNet


class WorldFolderError(ValueError):
    """A folder that is not a trained game world, or one trained on another game."""


@dataclass
class GameWorld:
    """``unet`` in eval mode; ``change_weight``: the loss weight training gave pixels that
    change, undone at decoding (``next_frame``)."""

    unet: GameUNet
    palette: Palette
    env_id: str
    size: int
    action_meanings: tuple[str, ...]
    change_weight: float

    @property
    def context(self) -> int:
        return int(self.unet.config.context)

    @property
    def samples(self) -> bool:
        """Whether the next frame depends on a draw (the network has an outcome code)."""
        return bool(self.unet.config.code_grid)

    @property
    def draws(self) -> int:
        """Uniform draws one frame takes (``next_frame``'s ``u``): the code's cells."""
        return self.unet.code_cells

    def code(self, frames: torch.Tensor, actions: torch.Tensor,
             u: torch.Tensor | None) -> torch.Tensor | None:
        """The frame's outcome code ``(B, classes, grid, grid)`` float one-hots sampled from
        the prior with ``u`` ``(B, draws)`` uniforms (None: the most likely code); None
        without one."""
        prior = self.unet.code_prior
        if prior is None:
            return None
        return self.unet.code_onehot(prior.sample(prior.logits(frames, actions), u))

    def logits(self, frames: torch.Tensor, actions: torch.Tensor,
               u: torch.Tensor | None = None) -> torch.Tensor:
        """Calibrated logits ``(B, K, H, W)``: the network's (given the code drawn with ``u``),
        less ``log(change_weight)`` on every colour that differs from the last frame's
        (weighted cross-entropy learns odds multiplied by that weight)."""
        logits = self.unet(frames, actions, self.code(frames, actions, u)).float()
        if self.change_weight != 1.0:
            last = torch.nn.functional.one_hot(frames[:, -1], len(self.palette))
            logits = logits - math.log(self.change_weight) * (1 - last.permute(0, 3, 1, 2))
        return logits

    @torch.no_grad()
    def next_frame(self, frames: torch.Tensor, actions: torch.Tensor,
                   u: torch.Tensor | None = None) -> torch.Tensor:
        """The next frame ``(B, H, W)`` long palette indices (``frames`` ``(B, context, H,
        W)`` and ``actions`` ``(B, context)`` long, as ``GameUNet`` reads them): one outcome
        drawn with ``u`` (``(B, draws)`` uniforms in [0, 1); see :func:`frame_draws`), then
        each pixel's most likely colour. A function of the three, so play, replay and forks
        repeat exactly."""
        return self.logits(frames, actions, u).argmax(1)

    def save(self, folder: str | Path) -> None:
        """Write the folder; the weights as bf16 (half the bytes; the CPU computes in bf16
        anyway), and this world's own weights rounded the same way, so that it and the
        folder's ``load_world`` give the same frames."""
        folder = Path(folder)
        with torch.no_grad():
            for p in self.unet.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        self.unet.to(torch.bfloat16).save_pretrained(folder / "unet")
        self.unet.float()
        (folder / "world.json").write_text(json.dumps({
            "env": self.env_id, "size": self.size,
            "palette": self.palette.colours.tolist(),
            "action_meanings": list(self.action_meanings),
            "change_weight": self.change_weight}, indent=1) + "\n")


def frame_draws(seeds: np.ndarray, steps: np.ndarray, draws: int) -> torch.Tensor:
    """``(B, draws)`` float32 uniforms in [0, 1) for frame ``steps[i]`` (its index since the
    session's start) of the session of ``seeds[i]``: a function of the two only, so a replay,
    a fork and a loaded save point draw the same outcome at the same frame."""
    out = np.stack([np.random.default_rng([int(s), int(t), 0x5EED]).random(draws)
                    for s, t in zip(np.asarray(seeds).ravel(), np.asarray(steps).ravel())])
    return torch.from_numpy(out.astype(np.float32).reshape(-1, draws))


def load_world(folder: str | Path, env_id: str | None = None) -> GameWorld:
    """The game world in ``folder``; WorldFolderError naming the missing file, or the game it
    was trained on when that is not ``env_id``."""
    folder = Path(folder)
    meta_path = folder / "world.json"
    if not meta_path.exists():
        raise WorldFolderError(f"{folder} is not a game world: no world.json (train one with "
                               "`worldstream train --env ID --out DIR`)")
    try:
        meta = read_json_file(meta_path, MAX_META_BYTES)
        env, size = str(meta["env"]), int(meta["size"])
        palette = Palette(np.asarray(meta["palette"], dtype=np.uint8))
        meanings, weight = tuple(str(m) for m in meta["action_meanings"]), \
            float(meta["change_weight"])
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        raise WorldFolderError(f"{meta_path}: damaged ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if env_id is not None and env != env_id:
        raise WorldFolderError(f"{folder} is a world of {env!r}, not {env_id!r}")
    if not (folder / "unet" / "config.json").exists():
        raise WorldFolderError(f"{folder}: missing unet/config.json")
    try:
        unet = GameUNet.from_pretrained(folder / "unet", low_cpu_mem_usage=False,
                                        torch_dtype=torch.float32).eval()
    except (OSError, ValueError, RuntimeError) as exc:
        raise WorldFolderError(f"{folder}/unet: cannot load the weights "
                               f"({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    if unet.config.num_colours != len(palette) or unet.config.num_actions != len(meanings):
        raise WorldFolderError(f"{folder}: the network's colours/actions do not match "
                               "world.json")
    return GameWorld(unet, palette, env, size, meanings, weight)

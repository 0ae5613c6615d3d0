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
        """Whether play draws each frame (a flow from a seeded noise draw; else the world is
        a function of its context and actions, the argmax of its logits)."""
        return self.flow_steps > 0

    @property
    def flow_steps(self) -> int:
        return int(self.unet.config.get("flow_steps", 0))

    @property
    def rgb(self) -> torch.Tensor:
        """The palette's colours in the flow's space: ``(K, 3)`` float32 in [-1, 1]."""
        return torch.from_numpy(self.palette.signed())

    def noise(self, seed: int, step: int) -> torch.Tensor:
        """The standard normal draw behind frame ``step`` of a session of ``seed``:
        ``(3, size, size)`` float32, a pure function of the two (replay, forks and save points
        need no generator state); numpy's generator, the same on every machine."""
        rng = np.random.default_rng([int(seed), int(step)])
        return torch.from_numpy(rng.standard_normal((3, self.size, self.size),
                                                    dtype=np.float32))

    def logits(self, frames: torch.Tensor, actions: torch.Tensor,
               noisy: torch.Tensor | None = None,
               level: torch.Tensor | None = None) -> torch.Tensor:
        """Calibrated logits ``(B, K, H, W)``: the network's, less ``log(change_weight)`` on
        every colour that differs from the last frame's (weighted cross-entropy learns odds
        multiplied by that weight). ``noisy``/``level``: a flow world's noisy next frame
        ``(B, 3, H, W)`` and its noise level ``(B,)``."""
        logits = self.unet(frames, actions, None, noisy, level).float()
        if self.change_weight != 1.0:
            last = torch.nn.functional.one_hot(frames[:, -1], len(self.palette))
            logits = logits - math.log(self.change_weight) * (1 - last.permute(0, 3, 1, 2))
        return logits

    @torch.no_grad()
    def next_frame(self, frames: torch.Tensor, actions: torch.Tensor,
                   noise: torch.Tensor | None = None) -> torch.Tensor:
        """The next frame ``(B, H, W)`` long palette indices. A flow world integrates from
        ``noise`` ``(B, 3, H, W)`` standard normal (None: zeros) in ``flow_steps`` Euler steps
        at levels ``0, 1/n, ...``: each step moves the frame towards the network's expected
        clean frame, and the last step's argmax is the frame; otherwise the argmax of
        ``logits``."""
        if not self.samples:
            return self.logits(frames, actions).argmax(1)
        n = self.flow_steps
        b, _, h, w = frames.shape
        x = (torch.zeros(b, 3, h, w, device=frames.device) if noise is None
             else noise.to(frames.device, torch.float32))
        rgb = self.rgb.to(frames.device)
        for i in range(n):
            t = i / n
            logits = self.logits(frames, actions, x, torch.full((b,), t, device=frames.device))
            if i == n - 1:
                return logits.argmax(1)
            clean = torch.einsum("bkhw,kc->bchw", logits.softmax(1), rgb)
            x = x + (clean - x) / (n - i)  # Euler: dt / (1 - t) with dt = 1 / n
        raise AssertionError("unreachable")

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


def load_world(folder: str | Path, env_id: str | None = None) -> GameWorld:
    """The game world in ``folder``; WorldFolderError naming the missing file, or the game it
    was trained on when that is not ``env_id``."""
    folder = Path(folder)
    meta_path = folder / "world.json"
    if not meta_path.exists():
        raise WorldFolderError(f"{folder} is not a game world: no world.json (train one with "
                               "`worldstream train --env ID --out DIR`)")
    try:
        meta = json.loads(meta_path.read_text())
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

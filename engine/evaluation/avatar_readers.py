"""Readers of one character's expression and head direction, by nearest crop among the
simulator's frames of that character holding each expression or direction from rest."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from worldstream.engine.worlds.actions import IDLE, NUM_ACTIONS
from worldstream.engine.worlds.avatar.actions import EXPRESSIONS, NEUTRAL, encode_action
from worldstream.engine.worlds.avatar.simulator import AvatarSimulator

TURN_GATE = 0.35  # TurnTemplates: a readable head is this near its pose (relative distance)


class CharacterTemplates:
    """Crops of one character (the stream's seed and look) as the simulator draws it holding
    each of a list of avatar actions from rest: ``templates (A, T, h, w, 3)`` float32, frames
    ``first``-39 of each, cropped to ``CROP`` and blurred 3×3 (which forgives the
    autoencoder's softness). :meth:`distances` compares frames with them."""

    CROP: tuple[slice, slice]

    def __init__(self, seed: int, look: str, actions: list[int], first: int):
        crops = []
        for action in actions:
            sim = AvatarSimulator(seed, look)
            frames = [sim.step(action) for _ in range(40)]
            crops.append(self._prepare(np.stack(frames[first:])))
        self.templates = np.stack(crops)

    @classmethod
    def _prepare(cls, frames: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(frames)[:, cls.CROP[0], cls.CROP[1]]).float()
        x = F.avg_pool2d(x.permute(0, 3, 1, 2), 3, 1, 1, count_include_pad=False)
        return x.permute(0, 2, 3, 1).numpy()

    def distances(self, frames: np.ndarray) -> np.ndarray:
        """``(N, A)`` float32: mean squared distance of each ``(N, 128, 128, 3)`` uint8
        frame's crop to the nearest crop of each action."""
        out = []
        for i in range(0, len(frames), 32):  # bounded memory: (32, T, h, w, 3) at a time
            q = self._prepare(frames[i : i + 32])
            out.append(np.stack([((q[:, None] - t[None]) ** 2).mean(axis=(2, 3, 4)).min(1)
                                 for t in self.templates], axis=1))
        return np.concatenate(out)


class ExpressionTemplates(CharacterTemplates):
    """Expression classifier of one character: for each expression, the face crops of frames
    15-39 of the simulator holding it (head idle, silent: they cover the idle sway, gazes and
    a blink); a frame is read as the expression with the nearest crop.

    NOTE: per character, not a CNN across characters (:class:`AvatarProbe`): the cue is a few
    px of eyelid or mouth corner, which a shared probe misreads on pale or bespectacled faces.
    Unlike :class:`TurnTemplates` there is no recognisability gate: the expressions differ by
    less than the autoencoder's own reconstruction error, so the nearest crop is the reading
    that holds up."""

    CROP = (slice(28, 84), slice(32, 96))

    def __init__(self, seed: int, look: str):
        super().__init__(seed, look, [encode_action(IDLE, e) for e in range(len(EXPRESSIONS))],
                         first=15)

    def read(self, frames: np.ndarray) -> np.ndarray:
        """``(N,)`` int expression index of each ``(N, 128, 128, 3)`` uint8 frame."""
        return self.distances(frames).argmin(axis=1)


class TurnTemplates(CharacterTemplates):
    """Head-direction reader of one character: for each of the nine directions, the head crops
    (rows 8-104, columns 16-112) of frames 10-39 of the simulator holding it from rest
    (neutral, silent: the head settled, with sway, gazes and a blink). A frame is read as the
    direction with the nearest crop, or as ``UNREADABLE`` (-1) when even that crop is farther
    than ``gate`` times the distance (mean squared) from that direction's crops to the
    nearest other direction's: a head must look like a head turned that way.

    NOTE: the gate exists because an ungated reading passes a scatter of eyes and glasses over
    a blur (the features' centroid moves the right way, but no head is drawn). ``TURN_GATE``
    is calibrated on held-out seeds to pass the simulator's frames and the autoencoder's
    reconstructions of them (see the model card)."""

    CROP = (slice(8, 104), slice(16, 112))
    UNREADABLE = -1

    def __init__(self, seed: int, look: str, gate: float = TURN_GATE):
        super().__init__(seed, look, [encode_action(d, NEUTRAL) for d in range(NUM_ACTIONS)],
                         first=10)
        t = self.templates
        between = np.array([[((t[a][:, None] - t[b][None]) ** 2).mean(axis=(2, 3, 4)).min()
                             if a != b else np.inf for b in range(NUM_ACTIONS)]
                            for a in range(NUM_ACTIONS)])
        self.limit = gate * between.min(axis=1)  # (9,) largest distance still readable

    def read(self, frames: np.ndarray, share: float = 1.0) -> np.ndarray:
        """``(N,)`` int direction id (``engine.worlds.actions``) of each ``(N, 128, 128, 3)``
        uint8 frame, or ``UNREADABLE``; ``share`` of the gate (< 1: a stricter reading)."""
        return self.readings(frames, (share,))[0]

    def readings(self, frames: np.ndarray, shares: tuple[float, ...]) -> list[np.ndarray]:
        """:meth:`read` at each of ``shares`` of the gate, the distances computed once."""
        d = self.distances(frames)
        nearest = d.argmin(axis=1)
        dist = d[np.arange(len(d)), nearest]
        return [np.where(dist <= share * self.limit[nearest], nearest, self.UNREADABLE)
                for share in shares]

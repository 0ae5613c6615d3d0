"""Head warp: the avatar's head pose path from the keys, and the memory picture moved to a pose.

The avatar's camera never moves, so its spatial memory holds one picture of the character at
rest. :class:`HeadWarp` holds what every rig shares: the pose path (the held direction keys
with the rig's easing, ``HEAD_RATE`` of the gap closed a frame: the model's head dynamics, as
the landscape's camera dynamics give its camera path), poses rounded to ``1 / POSE_STEPS`` so a
settled head reads one picture frame after frame, and a smooth displacement field (the head
outline shifted by ``HEAD_SHIFT``, the features by ``HEAD_SHIFT + FEATURE_SHIFT`` times the
pose). The shipped rig, which moves each part by its own amount, is
``engine.worlds.avatar.head_rig.FittedRigHeadWarp``. The source image is always the
remembered picture, warped once (no warp of a warp, so nothing compounds).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from worldstream.engine.worlds.actions import action_to_direction
from worldstream.engine.worlds.avatar.actions import decode_action
from worldstream.engine.worlds.avatar.simulator import (
    FEATURE_SHIFT,
    HEAD_CENTRE,
    HEAD_RADII,
    HEAD_RATE,
)
from worldstream.engine.worlds.avatar.simulator import HEAD_SHIFT as OUTLINE_SHIFT

#: pose quantum: 1/32 of full yaw moves the features half a pixel
POSE_STEPS = 32
#: the features' region at rest (centre between the brows and the mouth, radii, px) and the
#: widths (px) over which each displacement falls to zero outside its region: wide enough
#: that the field never folds (its Jacobian stays positive: no content is duplicated)
FEATURE_CENTRE = (HEAD_CENTRE[0], HEAD_CENTRE[1] + 4.0)
FEATURE_RADII = (17.0, 19.0)
HEAD_FALLOFF, FEATURE_FALLOFF = 14.0, 16.0


def _smooth_region(xs: torch.Tensor, ys: torch.Tensor, centre, radii, falloff: float
                   ) -> torch.Tensor:
    """``(H, W)`` float32 weight: 1 inside the ellipse, smoothstep to 0 over ``falloff`` px."""
    r = torch.sqrt(((xs - centre[0]) / radii[0]) ** 2 + ((ys - centre[1]) / radii[1]) ** 2)
    t = ((r - 1.0) * min(radii) / falloff).clamp(0.0, 1.0)
    return 1.0 - t * t * (3.0 - 2.0 * t)


def displacement(pose: np.ndarray, size: int = 128, rigid: bool = False) -> torch.Tensor:
    """``(2, size, size)`` float32 displacement (x, y in px) of the content shown at each output
    pixel for head pose ``pose = (yaw, pitch)`` in [-1, 1]: the output pixel ``p`` shows the
    picture at rest at ``p - d(p)``. Zero at pose (0, 0). ``rigid``: the outline's shift
    everywhere (a layer that moves as one; its mask confines it), not only inside the head."""
    yaw, pitch = float(pose[0]), float(pose[1])
    ys, xs = torch.meshgrid(torch.arange(size, dtype=torch.float32),
                            torch.arange(size, dtype=torch.float32), indexing="ij")
    outline = (OUTLINE_SHIFT[0] * yaw, OUTLINE_SHIFT[1] * pitch)
    features = (outline[0] + FEATURE_SHIFT[0] * yaw, outline[1] + FEATURE_SHIFT[1] * pitch)
    head = 1.0 if rigid else _smooth_region(
        xs, ys, (HEAD_CENTRE[0] + outline[0], HEAD_CENTRE[1] + outline[1]), HEAD_RADII,
        HEAD_FALLOFF)
    face = _smooth_region(xs, ys, (FEATURE_CENTRE[0] + features[0],
                                   FEATURE_CENTRE[1] + features[1]), FEATURE_RADII,
                          FEATURE_FALLOFF)
    return torch.stack([outline[0] * head + (features[0] - outline[0]) * face,
                        outline[1] * head + (features[1] - outline[1]) * face])


class HeadWarp:
    """The avatar world's base warp (``BuiltinBackend.pose_rig``): head poses from actions,
    and the memory picture warped to a pose (bilinear, ``torch.nn.functional.grid_sample``).
    Sampling grids are cached per pose (at most ``cache`` of them)."""

    #: the pose of a stream's first frames (the simulator starts every episode at rest)
    rest = np.zeros(2)
    #: the head's shift everywhere (``displacement``'s ``rigid``)
    rigid = False

    def __init__(self, size: int = 128, cache: int = 256):
        self.size = size
        self._grids: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()
        self._cache = cache

    @staticmethod
    def path(pose: np.ndarray, actions: list[int]) -> np.ndarray:
        """``(F, 2)`` float64 head pose (yaw, pitch) after each of ``actions`` (avatar action
        ids), from ``pose`` ``(2,)`` before the first. The poses are exact (the next path
        continues from the last); :meth:`apply` rounds them. ValueError for an action id out
        of range."""
        yaw, pitch = float(pose[0]), float(pose[1])
        out = np.empty((len(actions), 2))
        for i, action in enumerate(actions):
            dx, dy = action_to_direction(decode_action(int(action))[0])
            yaw += HEAD_RATE * (dx - yaw)
            pitch += HEAD_RATE * (dy - pitch)
            out[i] = yaw, pitch
        return out

    @staticmethod
    def quantise(pose: np.ndarray) -> tuple[int, int]:
        """The pose in steps of ``1 / POSE_STEPS`` (what :meth:`apply` warps to).

        NOTE: rounded here, not in :meth:`path`: rounding the eased pose each frame stalls it
        where a quarter of the gap is under half a step (at 0.94 yaw instead of 1)."""
        return int(round(pose[0] * POSE_STEPS)), int(round(pose[1] * POSE_STEPS))

    def _cached(self, cache: OrderedDict, key: tuple[int, int], make) -> torch.Tensor:
        """``cache[key]``, made by ``make(key)`` if missing; the last ``self._cache`` used."""
        value = cache.get(key)
        if value is None:
            value = cache[key] = make(key)
            while len(cache) > self._cache:
                cache.popitem(last=False)
        cache.move_to_end(key)
        return value

    def _make_grid(self, key: tuple[int, int]) -> torch.Tensor:
        d = displacement(np.array(key) / POSE_STEPS, self.size, self.rigid)
        ys, xs = torch.meshgrid(torch.arange(self.size, dtype=torch.float32),
                                torch.arange(self.size, dtype=torch.float32), indexing="ij")
        # grid_sample's normalised coordinates, pixel centres (align_corners=False)
        return torch.stack([(xs - d[0] + 0.5) * 2 / self.size - 1,
                            (ys - d[1] + 0.5) * 2 / self.size - 1], dim=-1)[None]

    def _pose_key(self, picture: np.ndarray, pose: np.ndarray) -> tuple[int, int] | None:
        """``pose`` quantised (:meth:`quantise`), or None at rest (the picture is shown as it
        is). ValueError for a picture not ``(size, size, 3)``."""
        if picture.shape != (self.size, self.size, 3):
            raise ValueError(f"picture must be ({self.size}, {self.size}, 3), "
                             f"got {picture.shape}")
        key = self.quantise(pose)
        return None if key == (0, 0) else key

    def apply(self, picture: np.ndarray, pose: np.ndarray) -> np.ndarray:
        """``picture (S, S, 3)`` uint8 (the memory picture at rest) warped to ``pose``
        ``(2,)`` rounded to ``1 / POSE_STEPS``; the picture itself (not a copy) where that is
        (0, 0). ValueError for another size."""
        key = self._pose_key(picture, pose)
        if key is None:
            return picture
        x = torch.from_numpy(np.ascontiguousarray(picture)).permute(2, 0, 1)[None].float()
        out = F.grid_sample(x, self._cached(self._grids, key, self._make_grid),
                            mode="bilinear", padding_mode="border",
                            align_corners=False)
        return out[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def _pixel_coords(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xs, ys)``, each ``(size, size)`` float32: every pixel's column and row."""
    ys, xs = torch.meshgrid(torch.arange(size, dtype=torch.float32),
                            torch.arange(size, dtype=torch.float32), indexing="ij")
    return xs, ys


def _nearest_outside(region: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)`` int64 ``(H, W)``: for each pixel of ``region`` (``(H, W)`` bool) the
    nearest pixel outside it, every other pixel itself (``scipy.ndimage.
    distance_transform_edt``'s indices): a region filled from around it, image inpainting's
    simplest fill."""
    rows, cols = ndimage.distance_transform_edt(region.numpy(), return_distances=False,
                                                return_indices=True)
    return torch.from_numpy(rows), torch.from_numpy(cols)

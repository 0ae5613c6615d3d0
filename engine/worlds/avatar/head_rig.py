"""The avatar's rigged head warp: each part of the character at rest moved by the rig's own amount.

:class:`FittedRigHeadWarp` (``BASE_WARPS["head_rig_fit"]``) is the warp the shipped avatar model
was trained with: its second skip source is the memory picture moved by it to each frame's pose.
A 2-D puppet rig (cut-out animation's parts moving by their own amounts), with each character's
build (face width, long hair, bun, hat) read from its picture at rest (:func:`fit_build`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from worldstream.engine.worlds.avatar.head_warp import (
    POSE_STEPS,
    HeadWarp,
    _nearest_outside,
    _pixel_coords,
)
from worldstream.engine.worlds.avatar.simulator import FEATURE_SHIFT, HEAD_CENTRE, HEAD_RADII
from worldstream.engine.worlds.avatar.simulator import HEAD_SHIFT as OUTLINE_SHIFT

#: :class:`RigHeadWarp`'s parts, as the simulator draws them (``AvatarSimulator.render``): how
#: far each moves per unit of yaw (px, beside the head's ``HEAD_SHIFT``; a lag moves less than
#: the head, a lead more), the face's narrowing per unit of |yaw|, the far eye's squash per unit
#: of yaw, the eyes' offset from the features' centre (px), and each feature part's region at
#: rest (centre offset from the features' centre, radii; px)
SHIRT_SHIFT, NECK_SHIFT, HAIR_LAG, FRINGE_LAG, NOSE_LEAD = 2.0, 3.0, 1.5, 2.0, 2.0
LONG_HAIR_LAG, BUN_LAG, SUNHAT_LAG, CAP_BRIM_LEAD = 2.0, 4.0, 1.0, 14.0
FACE_NARROWING, EYE_SQUASH, EYE_OFFSET = 0.08, 0.3, 9.5
EYE_PART = ((0.0, -5.0), (8.5, 10.0))  # an eye with its brow and a glasses ring
NOSE_PART = ((0.0, 5.0), (3.5, 4.2))
MOUTH_PART = ((0.0, 14.0), (10.0, 6.0))
NECK_BOTTOM = 112.0  # the collar's row (px)


@dataclass(frozen=True)
class RigBuild:
    """The parts a character's rig has: ``face_width`` scales the face's half-width (1.0 =
    ``HEAD_RADII[0]``), ``hair`` one of ``looks.HAIR_STYLES``, ``hat`` one of ``looks.HATS``."""

    face_width: float = 1.0
    hair: str = "short"
    hat: str | None = None


#: the build :class:`RigHeadWarp` assumes for every picture (the face's width, no long hair,
#: bun or hat)
PLAIN_BUILD = RigBuild()
#: :func:`fit_build`'s colour tolerance (RGB distance, levels): two patches nearer than this
#: are taken for the same part's colour (the autoencoder moves a flat patch by less; a hair and
#: skin this alike are not told apart, tests/worlds/test_head_warp.py)
BUILD_TOLERANCE = 40.0


def _patch(picture: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
    """``(3,)`` float64 median colour of ``picture[rows, cols]``."""
    return np.median(picture[rows, cols].reshape(-1, 3).astype(np.float64), axis=0)


def _near(a: np.ndarray, b: np.ndarray) -> bool:
    return float(np.linalg.norm(a - b)) < BUILD_TOLERANCE


def fit_build(picture: np.ndarray) -> RigBuild:
    """The :class:`RigBuild` of the character in ``picture`` ``(S, S, 3)`` uint8 (at rest), read
    at the places where the simulator's parts differ (``AvatarSimulator.render``'s geometry),
    by colour: the hair's from the fringe (under any hat), the skin's from a cheek;

    - the face's width: the run of skin across the cheeks (rows 61-63) over the ellipse's
      width there, quantised to 0.02 (1.0 where hair and skin are too alike to tell apart);
    - long hair: the hair's colour beside the jaw on both sides; a bun: above the head's top
      and not beside it;
    - a sun hat: its brim's colour even across both ends of the brim and unlike the scene past
      them; a cap or beanie: the crown's colour not the hair's, a cap where the crown's colour
      rather than the beanie band's (0.8 of it) lies at the band's ends.

    A picture of no character reads as some build; the warp then moves what lies where that
    character's parts would be. ValueError for a picture not ``(128, 128, 3)`` (the places
    are the simulator's, in px)."""
    if picture.shape != (128, 128, 3):
        raise ValueError(f"fit_build reads 128x128 RGB pictures, got {picture.shape}")
    hair = _patch(picture, slice(39, 41), slice(62, 67))
    skin = _patch(picture, slice(58, 64), slice(50, 55))
    face_width = 1.0
    if not _near(hair, skin):
        rgb = picture[61:64].astype(np.float64)
        to_skin = np.linalg.norm(rgb - skin, axis=2)
        is_skin = (to_skin < BUILD_TOLERANCE) & (to_skin < np.linalg.norm(rgb - hair, axis=2))
        widths = []
        for row, line in zip(range(61, 64), is_skin):
            off = np.flatnonzero(~line)
            left, right = off[off < 64], off[off > 64]
            span = (right.min() if right.size else 128) - (left.max() if left.size else -1) - 1
            dy = (row - HEAD_CENTRE[1]) / HEAD_RADII[1]
            widths.append(span / 2 / (HEAD_RADII[0] * np.sqrt(1 - dy * dy)))
        face_width = round(float(np.clip(np.median(widths), 0.8, 1.2)) / 0.02) * 0.02
    rx = HEAD_RADII[0] * face_width
    beside_jaw = [_patch(picture, slice(74, 77), slice(c - 1, c + 2))
                  for c in (int(64 - rx - 1), int(64 + rx + 1))]
    if all(_near(c, hair) for c in beside_jaw):
        style = "long"
    elif (_near(_patch(picture, slice(11, 14), slice(62, 67)), hair)
          and not _near(_patch(picture, slice(11, 14), slice(40, 45)), hair)):
        style = "bun"
    else:
        style = "short"
    crown = _patch(picture, slice(22, 26), slice(60, 69))
    brims = [_patch(picture, slice(31, 34), slice(int(c - 4), int(c + 4)))
             for c in (64 - rx - 12, 64 + rx + 12)]
    beyond = [_patch(picture, slice(31, 34), slice(int(c - 3), int(c + 3)))
              for c in (64 - rx - 27, 64 + rx + 27)]
    hat = None
    if _near(*brims) and not any(_near(b, o) for b, o in zip(brims, beyond)):
        hat = "sunhat"
    elif not _near(crown, hair):
        # the beanie's band (0.8 of the crown's colour) reaches past a cap's brim, where the
        # cap shows its crown
        band_ends = [_patch(picture, slice(33, 35), slice(c - 1, c + 2)) for c in (42, 86)]
        crown_dark = 0.8 * crown
        hat = "cap" if all(np.linalg.norm(e - crown) < np.linalg.norm(e - crown_dark)
                           for e in band_ends) else "beanie"
    return RigBuild(face_width, style, hat)


def _ellipse(xs: torch.Tensor, ys: torch.Tensor, centre, radii) -> torch.Tensor:
    """``(H, W)`` bool: inside the ellipse."""
    return ((xs - centre[0]) / radii[0]) ** 2 + ((ys - centre[1]) / radii[1]) ** 2 <= 1.0


class RigHeadWarp(HeadWarp):
    """The head warp as the character's rig moves it: each part of the picture at rest moves
    by its own amount — the shirt 2 px and the neck 3 px per unit of
    yaw, the hair 1.5 px less than the face, the face by ``HEAD_SHIFT`` and narrowed by 8 % per
    unit of |yaw|, the eyes, nose and mouth by ``HEAD_SHIFT + FEATURE_SHIFT``, the eye on the
    far side of the turn squashed by 30 % per unit of yaw and the near one widened — over the
    background with the character's region at rest filled from the nearest pixel outside it.
    Every output pixel shows the topmost part that covers it at the pose (painted in the
    simulator's order: shirt, neck, long hair, hair, bun, face, fringe, features, hat), sampled
    where that part lay at rest; the face samples a copy of the picture with its features
    painted over in the skin's median colour, so that the face moving less than its features
    does not carry them along twice.

    A 2-D puppet rig. This class rigs every picture as :data:`PLAIN_BUILD`: what that does not
    hold (a hat, long hair's ends, a bun, the face's width) stays where the parts around it
    put it; :class:`FittedRigHeadWarp` rigs each picture's own build."""

    #: the parts painted on the face that move with its features, each (region at rest, as
    #: :data:`NOSE_PART`; px of lead per unit of yaw beyond the features' shift)
    painted_parts: tuple = ((NOSE_PART, NOSE_LEAD), (MOUTH_PART, 0.0))

    def __init__(self, size: int = 128, cache: int = 256):
        super().__init__(size, cache)
        self._xs, self._ys = _pixel_coords(size)
        self._face = _ellipse(self._xs, self._ys, HEAD_CENTRE, HEAD_RADII)
        self._features = self._feature_parts(*HEAD_CENTRE)
        self._maps: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._fills: dict[RigBuild, tuple[torch.Tensor, torch.Tensor]] = {}

    def build(self, picture: np.ndarray) -> RigBuild:
        """The build the rig gives ``picture``: :data:`PLAIN_BUILD` for every picture."""
        return PLAIN_BUILD

    def _fill(self, build: RigBuild) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` float32 ``(S, S)`` each: the pixel each one shows once the character's
        region at rest (every part ``build`` has, with a margin for the anti-aliased edge) is
        filled from the nearest pixel outside it."""
        if build not in self._fills:
            xs, ys = self._xs, self._ys
            cx, cy = HEAD_CENTRE
            rx, ry = HEAD_RADII[0] * build.face_width, HEAD_RADII[1]
            body = (_ellipse(xs, ys, (64.0, 140.0), (54.0, 40.0))
                    | _ellipse(xs, ys, (cx, cy - 3), (rx + 5, ry + 4))
                    | ((xs - 64.0).abs() < 10) & (ys > cy + 17))
            if build.hair == "long":
                body |= _ellipse(xs, ys, (cx, cy + 12), (rx + 8, ry + 16))
            if build.hair == "bun":
                body |= _ellipse(xs, ys, (cx, cy - ry - 5), (12, 10))
            if build.hat == "sunhat":
                body |= (_ellipse(xs, ys, (cx, cy - 20), (rx + 20, 8))
                         | _ellipse(xs, ys, (cx, cy - 24), (rx, 14)))
            elif build.hat is not None:
                body |= _ellipse(xs, ys, (cx, cy - 14), (rx + 5, ry - 4)) & (ys < cy - 12)
            rows, cols = _nearest_outside(body)
            self._fills[build] = (cols.float(), rows.float())
        return self._fills[build]

    def _feature_parts(self, fx: float, fy: float) -> torch.Tensor:
        """``(H, W)`` bool: the eyes', nose's and mouth's regions at rest, the features' centre
        at (``fx``, ``fy``)."""
        xs, ys = self._xs, self._ys
        (ox, oy), radii = EYE_PART
        out = torch.zeros_like(xs, dtype=torch.bool)
        for side in (-1, 1):
            out |= _ellipse(xs, ys, (fx + side * EYE_OFFSET + ox, fy + oy), radii)
        for ((ox, oy), radii), _ in self.painted_parts:
            out |= _ellipse(xs, ys, (fx + ox, fy + oy), radii)
        return out

    def _make_maps(self, key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampling grid ``(1, S, S, 2)`` (grid_sample's coordinates) and the face mask
        ``(S, S)`` bool (pixels sampled from the cleaned picture) for ``key`` = (build, yaw
        steps, pitch steps)."""
        build, *pose = key
        yaw, pitch = np.array(pose) / POSE_STEPS
        xs, ys = self._xs, self._ys
        cx0, cy0 = HEAD_CENTRE
        rx0, ry = HEAD_RADII[0] * build.face_width, HEAD_RADII[1]
        cx, cy = cx0 + OUTLINE_SHIFT[0] * yaw, cy0 + OUTLINE_SHIFT[1] * pitch
        narrow = 1.0 - FACE_NARROWING * abs(yaw)
        rx = rx0 * narrow
        down = cy - cy0
        fx, fy = cx + FEATURE_SHIFT[0] * yaw, cy + FEATURE_SHIFT[1] * pitch
        fill_x, fill_y = self._fill(build)
        src_x, src_y = fill_x.clone(), fill_y.clone()
        face = torch.zeros_like(xs, dtype=torch.bool)

        def part(mask: torch.Tensor, sx: torch.Tensor, sy: torch.Tensor, is_face=False) -> None:
            src_x[mask], src_y[mask] = sx[mask], sy[mask]
            face[mask] = is_face

        def widened(centre_x: float, margin: float) -> torch.Tensor:
            """Source columns of a part centred at ``centre_x`` whose half-width is the face's
            plus ``margin`` px: it narrows with the face."""
            return cx0 + (xs - centre_x) * (rx0 + margin) / (rx + margin)

        part(_ellipse(xs, ys, (64.0 + SHIRT_SHIFT * yaw, 140.0), (54.0, 40.0)),
             xs - SHIRT_SHIFT * yaw, ys)
        # the neck runs from under the chin to the collar, which stays: stretched, not moved
        top0, top = cy0 + 18, cy + 18
        part(((xs - 64.0 - NECK_SHIFT * yaw).abs() < 9) & (ys > top) & (ys < NECK_BOTTOM),
             xs - NECK_SHIFT * yaw, top0 + (ys - top) * (NECK_BOTTOM - top0) / (NECK_BOTTOM - top))
        if build.hair == "long":  # behind the head, down to the shoulders
            lx = cx - LONG_HAIR_LAG * yaw
            part(_ellipse(xs, ys, (lx, cy + 12), (rx + 6, ry + 14)), widened(lx, 6), ys - down)
        hx = cx - HAIR_LAG * yaw
        part(_ellipse(xs, ys, (hx, cy - 3), (rx + 3, ry + 2)), widened(hx, 3), ys - down)
        if build.hair == "bun":
            bx = cx - BUN_LAG * yaw
            part(_ellipse(xs, ys, (bx, cy - ry - 5), (10, 8)), xs - (bx - cx0), ys - down)
        part(_ellipse(xs, ys, (cx, cy), (rx, ry)), cx0 + (xs - cx) / narrow, ys - down, True)
        part(_ellipse(xs, ys, (cx - FRINGE_LAG * yaw, cy - 16), (rx + 1, 15)) & (ys < cy - 12),
             xs - (OUTLINE_SHIFT[0] - FRINGE_LAG) * yaw, ys - down)
        # the features are painted on the face: a part's region reaching past the face's edge
        # would carry the hair or background beside the eye at rest along with it
        on_face = _ellipse(xs, ys, (cx, cy), (rx + 1, ry + 1))
        (ox, oy), (erx, ery) = EYE_PART
        for side in (-1, 1):
            squash = 1.0 - EYE_SQUASH * yaw * side  # the far eye narrows, the near one widens
            ex = fx + side * EYE_OFFSET * squash
            part(_ellipse(xs, ys, (ex + ox, fy + oy), (erx * squash, ery)) & on_face,
                 cx0 + side * EYE_OFFSET + (xs - ex) / squash, ys - (fy - cy0))
        for ((ox, oy), radii), lead in self.painted_parts:
            part(_ellipse(xs, ys, (fx + lead * yaw + ox, fy + oy), radii) & on_face,
                 xs - (fx + lead * yaw - cx0), ys - (fy - cy0))
        self._hat_parts(build, part, widened, (cx, cy, rx, ry, yaw, down))
        # grid_sample's normalised coordinates, pixel centres (align_corners=False)
        grid = torch.stack([(src_x + 0.5) * 2 / self.size - 1,
                            (src_y + 0.5) * 2 / self.size - 1], dim=-1)[None]
        return grid, face

    def _hat_parts(self, build: RigBuild, part, widened, at: tuple[float, ...]) -> None:
        """The hat's parts over everything (``part``, ``widened`` as in :meth:`_make_maps`;
        ``at`` the head's centre, radii, yaw and drop at the pose). A 0.5-px margin on the
        straight edges keeps their anti-aliased rows."""
        if build.hat is None:
            return
        xs, ys = self._xs, self._ys
        cx, cy, rx, ry, yaw, down = at
        if build.hat == "sunhat":
            sx = cx - SUNHAT_LAG * yaw
            brim = _ellipse(xs, ys, (sx, cy - 20), (rx + 18, 6))
            crown = _ellipse(xs, ys, (sx, cy - 24), (rx - 2, 12)) & (ys < cy - 19.5)
            part(brim | crown, widened(sx, 18), ys - down)
            return
        hx = cx - HAIR_LAG * yaw
        part(_ellipse(xs, ys, (hx, cy - 14), (rx + 3, ry - 6)) & (ys < cy - 16.5),
             widened(hx, 3), ys - down)
        if build.hat == "beanie":  # its band, centred on the face
            part(((ys - (cy - 18)).abs() < 3) & ((xs - cx).abs() < rx + 2.5), widened(cx, 2),
                 ys - down)
        else:  # a cap's brim swings toward the turn
            bx = cx + CAP_BRIM_LEAD * yaw
            part(_ellipse(xs, ys, (bx, cy - 17), (0.8 * rx + 0.5, 4)), widened(bx, 0.0), ys - down)

    def _cleaned(self, picture: np.ndarray) -> np.ndarray:
        """The picture with the face's features at rest painted over in the skin's median
        colour (the face below the brows, outside the features)."""
        skin_area = (self._face & ~self._features & (self._ys > HEAD_CENTRE[1] - 10)).numpy()
        clean = picture.copy()
        clean[(self._face & self._features).numpy()] = np.median(picture[skin_area], axis=0)
        return clean

    def apply(self, picture: np.ndarray, pose: np.ndarray) -> np.ndarray:
        """``picture (S, S, 3)`` uint8 (the memory picture at rest) with its parts moved to
        ``pose`` ``(2,)`` rounded to ``1 / POSE_STEPS``; the picture itself (not a copy) where
        that is (0, 0). What the turn uncovers of the character's region at rest shows the
        nearest pixel outside the region. ValueError for another size."""
        key = self._pose_key(picture, pose)
        if key is None:
            return picture
        grid, face = self._cached(self._maps, (self.build(picture), *key),
                                             self._make_maps)
        both = torch.from_numpy(np.stack([picture, self._cleaned(picture)])).permute(0, 3, 1, 2)
        out = F.grid_sample(both.float(), grid.expand(2, -1, -1, -1), mode="bilinear",
                            padding_mode="border", align_corners=False)
        out = torch.where(face, out[1], out[0])
        return out.permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


class FittedRigHeadWarp(RigHeadWarp):
    """:class:`RigHeadWarp` with each picture's own build (``BASE_WARPS["head_rig_fit"]``):
    the face's width, long hair, a bun and a hat read from the picture at rest
    (:func:`fit_build`) and moved as the simulator moves them — long hair 2 px and a bun 4 px
    per unit of yaw behind the head, a sun hat 1 px, a beanie or cap's crown 1.5 px, a cap's
    brim 14 px ahead of it — each over the parts the simulator paints before it.

    Why: the plain build leaves a sun hat's brim and long hair's ends in place and blends a
    cap's brim into the forehead."""

    def __init__(self, size: int = 128, cache: int = 256):
        super().__init__(size, cache)
        self._last: tuple[np.ndarray, RigBuild] | None = None

    def build(self, picture: np.ndarray) -> RigBuild:
        """The build read from ``picture`` (:func:`fit_build`); the last picture's is kept (a
        stream warps one memory picture frame after frame, and a compare costs far less than a
        fit)."""
        if self._last is None or not np.array_equal(self._last[0], picture):
            self._last = (picture.copy(), fit_build(picture))
        return self._last[1]

"""Head warp: the avatar's memory picture moved to the head pose the keys ask for.

The avatar's camera never moves, so its spatial memory holds one picture of the character at
rest, and every generated frame is the model's residual on it. A head turn then has to erase the
head at rest and draw it elsewhere, which the small model did as a ghost of two heads (assets/
avatar/MODEL_CARD.md). :class:`HeadWarp` gives the model a base that is already turned: the
picture at rest warped by a smooth displacement field, the head outline shifted by the rig's
``HEAD_SHIFT`` and the face features by ``HEAD_SHIFT + FEATURE_SHIFT`` times the pose, so the
residual is the turn's detail (the far eye narrowing, the hair's edge), not a whole new head.
The source image is always the remembered picture, warped once (no warp of a warp, so nothing
compounds). The idea is the motion-warped source image of face reenactment (First Order Motion
Model, Siarohin et al. 2019; LivePortrait, Guo et al. 2024) with the pose from the controls
instead of keypoints.

The pose follows the held direction keys with the rig's easing (``HEAD_RATE`` of the gap
closed a frame): the model's head dynamics, as the landscape's camera dynamics give its camera
path. The warp rounds poses to ``1 / POSE_STEPS`` so that a settled head reads one picture
frame after frame (the backend encodes each distinct base picture once).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

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
#: :class:`LayeredHeadWarp`'s head layer at rest (centre, radii, px): the head, its hair, a bun,
#: a hat's crown (not a sun hat's brim or the ends of long hair), and the edge's feather (px)
LAYER_CENTRE, LAYER_RADII, LAYER_FEATHER = (64.0, 46.0), (29.0, 35.0), 1.5


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
    """The avatar world's base warp (``BuiltinBackend.base_warp``): head poses from actions,
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

    def _pose_key(self, picture: np.ndarray, pose: np.ndarray,
                  backdrop: np.ndarray | None = None) -> tuple[int, int] | None:
        """``pose`` quantised (:meth:`quantise`), or None at rest (the picture is shown as it
        is). ValueError for a picture or ``backdrop`` not ``(size, size, 3)`` (a backdrop
        must also be uint8)."""
        if picture.shape != (self.size, self.size, 3):
            raise ValueError(f"picture must be ({self.size}, {self.size}, 3), "
                             f"got {picture.shape}")
        if backdrop is not None and (backdrop.shape != picture.shape
                                     or backdrop.dtype != np.uint8):
            raise ValueError(f"backdrop must be ({self.size}, {self.size}, 3) uint8, got "
                             f"{backdrop.shape} {backdrop.dtype}")
        key = self.quantise(pose)
        return None if key == (0, 0) else key

    def apply(self, picture: np.ndarray, pose: np.ndarray,
              backdrop: np.ndarray | None = None) -> np.ndarray:
        """``picture (S, S, 3)`` uint8 (the memory picture at rest) warped to ``pose``
        ``(2,)`` rounded to ``1 / POSE_STEPS``; the picture itself (not a copy) where that is
        (0, 0). ValueError for another size. ``backdrop``: the scene behind the character,
        for the warps that know what they uncover (:class:`RigHeadWarp`); this smooth field
        drags the background along and uncovers nothing, so it ignores it."""
        key = self._pose_key(picture, pose, backdrop)
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


def _layer_alpha(xs: torch.Tensor, ys: torch.Tensor, shift: tuple[float, float]
                 ) -> torch.Tensor:
    """``(H, W)`` float32 opacity of the head layer moved by ``shift`` (px): 1 inside the
    layer's ellipse, 0 outside, a ``LAYER_FEATHER``-px ramp across its edge."""
    rx, ry = LAYER_RADII
    r = torch.sqrt(((xs - LAYER_CENTRE[0] - shift[0]) / rx) ** 2
                   + ((ys - LAYER_CENTRE[1] - shift[1]) / ry) ** 2)
    return ((1.0 - r) * min(rx, ry) / LAYER_FEATHER + 0.5).clamp(0.0, 1.0)


class LayeredHeadWarp(HeadWarp):
    """The head warp as two layers (``BASE_WARPS["head_layer"]``): the head layer (an ellipse
    around the head and hair at rest, :data:`LAYER_RADII`) moves rigidly by the rig's
    ``HEAD_SHIFT`` times the pose, its face features a further ``FEATURE_SHIFT`` (the same
    field as :class:`HeadWarp` inside the head), and is laid over a background layer: the
    picture at rest with the head layer's ellipse filled from the nearest pixel outside it
    (``scipy.ndimage.distance_transform_edt``'s indices), so the ground a turn reveals shows
    the background beside the head and no second head.

    Why: :class:`HeadWarp`'s smooth field drags the neck, the hair's edge and the background
    along with the head, and it keeps the head at rest wherever the field has fallen to zero;
    a model trusting that picture inherited both (the ghost of the head at rest under the
    turned one, assets/avatar/MODEL_CARD.md). Layers are the compositing of 2.5-D animation
    (a moving foreground sprite over a background plate), filled as image inpainting's
    simplest nearest-neighbour fill. What the layer does not hold (a sun hat's brim, long
    hair's ends, the neck, which the rig moves less) stays in place."""

    rigid = True

    def __init__(self, size: int = 128, cache: int = 256):
        super().__init__(size, cache)
        self._xs, self._ys = _pixel_coords(size)
        self._fill = _nearest_outside(_layer_alpha(self._xs, self._ys, (0.0, 0.0)) > 0.0)
        self._alphas: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()

    def _make_alpha(self, key: tuple[int, int]) -> torch.Tensor:
        yaw, pitch = np.array(key) / POSE_STEPS
        shift = (OUTLINE_SHIFT[0] * yaw, OUTLINE_SHIFT[1] * pitch)
        return _layer_alpha(self._xs, self._ys, shift)[..., None]  # (S, S, 1)

    def apply(self, picture: np.ndarray, pose: np.ndarray,
              backdrop: np.ndarray | None = None) -> np.ndarray:
        """``picture (S, S, 3)`` uint8 (the memory picture at rest) with its head layer moved
        to ``pose`` ``(2,)`` rounded to ``1 / POSE_STEPS``, over the filled background; the
        picture itself (not a copy) where that is (0, 0). ValueError for another size.
        ``backdrop`` is ignored: the layer's ellipse also holds the neck and shoulders, which
        stay, so showing a plate there uncovered what the simulator still draws (its error
        on the pixels a backdrop changed rose in 8 of 12 held-out turns)."""
        moved = super().apply(picture, pose, backdrop)  # checks the backdrop, ignores it
        if moved is picture:
            return picture
        key = self.quantise(pose)
        rest = torch.from_numpy(np.ascontiguousarray(picture)).float()
        background = rest[self._fill[0], self._fill[1]]
        alpha = self._cached(self._alphas, key, self._make_alpha)
        out = alpha * torch.from_numpy(moved).float() + (1.0 - alpha) * background
        return out.round().clamp(0, 255).to(torch.uint8).numpy()


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
BRIDGE_PART = ((0.0, -4.0), (3.5, 2.5))  # between the eyes: a glasses' bridge
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
#: skin this alike are not told apart, tests/test_head_warp.py)
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
    """The head warp as the character's rig moves it (``BASE_WARPS["head_rig"]``): each part of
    the picture at rest moves by its own amount — the shirt 2 px and the neck 3 px per unit of
    yaw, the hair 1.5 px less than the face, the face by ``HEAD_SHIFT`` and narrowed by 8 % per
    unit of |yaw|, the eyes, nose and mouth by ``HEAD_SHIFT + FEATURE_SHIFT``, the eye on the
    far side of the turn squashed by 30 % per unit of yaw and the near one widened — over the
    background with the character's region at rest filled from the nearest pixel outside it.
    Every output pixel shows the topmost part that covers it at the pose (painted in the
    simulator's order: shirt, neck, long hair, hair, bun, face, fringe, features, hat), sampled
    where that part lay at rest; the face samples a copy of the picture with its features
    painted over in the skin's median colour, so that the face moving less than its features
    does not carry them along twice.

    Why: with :class:`LayeredHeadWarp`'s one rigid layer the best blend of the warped picture and
    the picture at rest under the squared error is 0.7 of the warped one at every blur of the
    error — its misses are the rig's effects it does not model (the narrower face, the far
    eye, the hair and neck moving less), as coarse as the head's own shift — so a model trained
    on it learns to draw a ghost of the head at rest. This warp of the picture at rest wins
    outright (the best blend is all of it), the error 0.0074 against 0.0128 on held-out turned
    frames (assets/avatar/MODEL_CARD.md). It is a 2-D puppet rig (cut-out animation's parts
    moving by their own amounts). This class rigs every picture as :data:`PLAIN_BUILD`: what
    that does not hold (a hat, long hair's ends, a bun, the face's width) stays where the parts
    around it put it; :class:`FittedRigHeadWarp` rigs each picture's own build."""

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

    def _make_maps(self, key: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sampling grid ``(1, S, S, 2)`` (grid_sample's coordinates), the face mask
        ``(S, S)`` bool (pixels sampled from the cleaned picture) and the uncovered mask
        ``(S, S)`` bool (the character's region at rest that no part covers: filled) for
        ``key`` = (build, yaw steps, pitch steps)."""
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
        covered = torch.zeros_like(xs, dtype=torch.bool)

        def part(mask: torch.Tensor, sx: torch.Tensor, sy: torch.Tensor, is_face=False) -> None:
            src_x[mask], src_y[mask] = sx[mask], sy[mask]
            face[mask] = is_face
            covered[mask] = True

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
        # the character's region at rest (where the fill does not point at the pixel itself)
        # that no part covers at this pose: the scene a turn uncovers
        uncovered = ((fill_x != xs) | (fill_y != ys)) & ~covered
        return grid, face, uncovered

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

    def apply(self, picture: np.ndarray, pose: np.ndarray,
              backdrop: np.ndarray | None = None) -> np.ndarray:
        """``picture (S, S, 3)`` uint8 (the memory picture at rest) with its parts moved to
        ``pose`` ``(2,)`` rounded to ``1 / POSE_STEPS``; the picture itself (not a copy) where
        that is (0, 0). What the turn uncovers of the character's region at rest shows
        ``backdrop`` ``(S, S, 3)`` uint8 (the scene behind the character: a background plate)
        where given, else the nearest pixel outside the region. ValueError for another size.

        Why a backdrop: the nearest-pixel fill drags the neck's and hair's colours over what a
        turn uncovers, and no fill can know a background that does not continue sideways (the
        city's lit windows): 40 % of the shipped model's error on the city's left turns lay
        there (assets/avatar/MODEL_CARD.md). Avatar systems composite the character over a
        known background plate; the avatar world's is drawn by its simulator."""
        key = self._pose_key(picture, pose, backdrop)
        if key is None:
            return picture
        grid, face, uncovered = self._cached(self._maps, (self.build(picture), *key),
                                             self._make_maps)
        both = torch.from_numpy(np.stack([picture, self._cleaned(picture)])).permute(0, 3, 1, 2)
        out = F.grid_sample(both.float(), grid.expand(2, -1, -1, -1), mode="bilinear",
                            padding_mode="border", align_corners=False)
        out = torch.where(face, out[1], out[0])
        if backdrop is not None:
            plate = torch.from_numpy(backdrop).permute(2, 0, 1).float()
            out = torch.where(uncovered, plate, out)
        return out.permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


class FittedRigHeadWarp(RigHeadWarp):
    """:class:`RigHeadWarp` with each picture's own build (``BASE_WARPS["head_rig_fit"]``):
    the face's width, long hair, a bun and a hat read from the picture at rest
    (:func:`fit_build`) and moved as the simulator moves them — long hair 2 px and a bun 4 px
    per unit of yaw behind the head, a sun hat 1 px, a beanie or cap's crown 1.5 px, a cap's
    brim 14 px ahead of it — each over the parts the simulator paints before it.

    Why: the plain build leaves a sun hat's brim and long hair's ends in place and blends a
    cap's brim into the forehead; on held-out characters the looks with those parts had the
    rig warp's largest errors against the simulator's turned frames (assets/avatar/
    MODEL_CARD.md)."""

    def __init__(self, size: int = 128, cache: int = 256):
        super().__init__(size, cache)
        self._last: tuple[np.ndarray, RigBuild] | None = None

    def build(self, picture: np.ndarray) -> RigBuild:
        """The build read from ``picture`` (:func:`fit_build`); the last picture's is kept (a
        stream warps one memory picture frame after frame: 0.35 ms a fit, 0.01 a compare)."""
        if self._last is None or not np.array_equal(self._last[0], picture):
            self._last = (picture.copy(), fit_build(picture))
        return self._last[1]


class BridgedRigHeadWarp(FittedRigHeadWarp):
    """:class:`FittedRigHeadWarp` with the strip between the eyes (a glasses' bridge) moved
    with the features (``BASE_WARPS["head_rig_bridge"]``).

    Why: the bridge's middle lies between the eyes' regions, on the face, which moves 9 px
    less than the features at full yaw and is sampled with the features painted over: the
    fitted rig drew the turned bridge broken, its middle skin, in the two looks with glasses,
    which are the ones whose turned heads the model still ghosts (assets/avatar/
    MODEL_CARD.md)."""

    painted_parts = ((BRIDGE_PART, 0.0), *RigHeadWarp.painted_parts)

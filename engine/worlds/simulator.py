"""A deterministic, infinite, top-down procedural world: the built-in model's data source and the
ground truth its rollouts are scored against.

The same seed and action sequence give identical frames. Terrain comes from hashed value noise
(cached per 128×128 tile); on top of it each frame draws water shimmer, drifting cloud shadows,
wandering creatures and the player sprite at the centre, which faces its direction of motion.
The camera has acceleration and inertia, so frame-to-frame motion is not a copy of the keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldstream.engine.worlds import scenes
from worldstream.engine.worlds.actions import IDLE, action_to_direction

SIZE = 128  # frame height and width, pixels
TILE = 128  # terrain cache tile, pixels
ACCEL = 1.1  # px / frame² while a key is held
FRICTION = 0.85  # velocity kept per frame; terminal speed = ACCEL·F/(1-F) ≈ 6.2 px/frame
SPRITE = 9  # player sprite side, pixels (centred)
CREATURE_CELL = 64  # one potential creature per cell of this side
TRANSITION_FRAMES = 12

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _hash(ix: np.ndarray, iy: np.ndarray, salt: int) -> np.ndarray:
    """Uniform [0, 1) float32 from integer lattice coordinates (a splitmix64-style mix)."""
    with np.errstate(over="ignore"):
        h = (
            (ix.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
            ^ (iy.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
            ^ np.uint64(salt * 0x165667B19E3779F9 & 0xFFFFFFFFFFFFFFFF)
        )
        h ^= h >> np.uint64(31)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(29)
    return ((h >> np.uint64(40)).astype(np.float32)) / np.float32(1 << 24)


def _value_noise(x: np.ndarray, y: np.ndarray, scale: float, salt: int) -> np.ndarray:
    """Smooth value noise in [0, 1) at float coordinates ``x, y`` (same shape)."""
    fx, fy = x / scale, y / scale
    ix, iy = np.floor(fx), np.floor(fy)
    tx, ty = fx - ix, fy - iy
    tx, ty = tx * tx * (3 - 2 * tx), ty * ty * (3 - 2 * ty)
    ix, iy = ix.astype(np.int64), iy.astype(np.int64)
    v00, v10 = _hash(ix, iy, salt), _hash(ix + 1, iy, salt)
    v01, v11 = _hash(ix, iy + 1, salt), _hash(ix + 1, iy + 1, salt)
    top = v00 + (v10 - v00) * tx
    bottom = v01 + (v11 - v01) * tx
    return (top + (bottom - top) * ty).astype(np.float32)


@dataclass
class _Tile:
    classes: np.ndarray  # (TILE, TILE) uint8 terrain class
    texture: np.ndarray  # (TILE, TILE, 1) float32 brightness multiplier


class WorldSimulator:
    """One episode of the built-in world.

    Args:
        seed: world seed (terrain, creatures, start position).
        scene: one of ``scenes.SCENE_NAMES``.
    ``step(action)`` advances one frame and returns it as ``(128, 128, 3)`` uint8 RGB.
    """

    def __init__(self, seed: int = 0, scene: str = "meadow"):
        scenes.palette(scene)  # validates the name
        self.seed = int(seed)
        self.scene = scene
        self._prev_scene = scene
        self._transition = 0  # frames left of a scene transition
        rng = np.random.default_rng(self.seed)
        self.pos = rng.uniform(-50_000, 50_000, size=2)  # camera centre, world px (x, y)
        self.vel = np.zeros(2)
        self.facing = (0, 1)
        self.t = 0
        self._tiles: dict[tuple[int, int], _Tile] = {}
        self._colour: dict[tuple[str, int, int], np.ndarray] = {}

    # -- terrain ---------------------------------------------------------------------------
    def _tile(self, tx: int, ty: int) -> _Tile:
        tile = self._tiles.get((tx, ty))
        if tile is None:
            ys, xs = np.mgrid[0:TILE, 0:TILE].astype(np.float64)
            xs += tx * TILE
            ys += ty * TILE
            s = self.seed
            h = (
                0.55 * _value_noise(xs, ys, 72, s)
                + 0.3 * _value_noise(xs, ys, 26, s + 1)
                + 0.15 * _value_noise(xs, ys, 9, s + 2)
            )
            veg = _value_noise(xs, ys, 14, s + 3) + 0.35 * _hash(
                xs.astype(np.int64) // 3, ys.astype(np.int64) // 3, s + 4
            )
            cls = np.full(h.shape, scenes.GROUND, np.uint8)
            cls[_value_noise(xs, ys, 20, s + 5) > 0.55] = scenes.GROUND2
            cls[veg > 0.95] = scenes.VEGETATION
            cls[(h > 0.66)] = scenes.ROCK
            cls[h < 0.40] = scenes.SHORE
            cls[h < 0.37] = scenes.SHALLOW
            cls[h < 0.31] = scenes.DEEP
            # smooth grain (3 px): texture for motion estimation that an 8x autoencoder can
            # still represent (per-pixel white noise would cap reconstruction near 28 dB)
            grain = _value_noise(xs, ys, 3.0, s + 6)
            texture = (0.9 + 0.2 * grain)[..., None].astype(np.float32)
            tile = _Tile(cls, texture)
            if len(self._tiles) > 64:
                self._tiles.clear()
            self._tiles[(tx, ty)] = tile
        return tile

    def _coloured(self, scene: str, tx: int, ty: int) -> np.ndarray:
        key = (scene, tx, ty)
        rgb = self._colour.get(key)
        if rgb is None:
            tile = self._tile(tx, ty)
            rgb = scenes.palette(scene)[tile.classes] * tile.texture
            if len(self._colour) > 64:
                self._colour.clear()
            self._colour[key] = rgb
        return rgb

    def _crop(self, getter, x0: int, y0: int) -> np.ndarray:
        """Assemble the ``SIZE × SIZE`` window at world (x0, y0) from cached tiles."""
        tx0, ty0 = x0 // TILE, y0 // TILE
        ox, oy = x0 - tx0 * TILE, y0 - ty0 * TILE
        rows = [
            np.concatenate([getter(tx0 + i, ty0 + j) for i in range(2)], axis=1) for j in range(2)
        ]
        big = np.concatenate(rows, axis=0)
        return big[oy : oy + SIZE, ox : ox + SIZE]

    # -- dynamics --------------------------------------------------------------------------
    def set_scene(self, scene: str, transition_frames: int = TRANSITION_FRAMES) -> None:
        """Switch scene; the palette cross-fades over ``transition_frames`` frames."""
        scenes.palette(scene)
        if scene == self.scene:
            return
        self._prev_scene, self.scene = self.scene, scene
        self._transition = transition_frames
        self._transition_len = max(transition_frames, 1)

    def step(self, action: int = IDLE) -> np.ndarray:
        """Apply one frame's action (``engine.worlds.actions`` id) and render the new frame."""
        dx, dy = action_to_direction(action)
        direction = np.array([dx, dy], dtype=np.float64)
        norm = np.hypot(dx, dy)
        if norm > 0:
            direction /= norm
            self.facing = (dx, dy)
        self.vel = (self.vel + ACCEL * direction) * FRICTION
        self.vel[np.abs(self.vel) < 0.05] = 0.0
        self.pos = self.pos + self.vel
        self.t += 1
        if self._transition > 0:
            self._transition -= 1
        return self.render()

    def crop_origin(self) -> tuple[int, int]:
        """World pixel ``(x, y)`` of the current frame's top-left corner: the camera path that
        the frames are shifted along (integer pixels)."""
        return int(np.floor(self.pos[0])) - SIZE // 2, int(np.floor(self.pos[1])) - SIZE // 2

    def render(self) -> np.ndarray:
        """The current frame, ``(128, 128, 3)`` uint8 RGB (no state change)."""
        x0, y0 = self.crop_origin()
        rgb = self._crop(lambda i, j: self._coloured(self.scene, i, j), x0, y0)
        if self._transition > 0:
            alpha = self._transition / self._transition_len
            old = self._crop(lambda i, j: self._coloured(self._prev_scene, i, j), x0, y0)
            rgb = rgb * (1 - alpha) + old * alpha
        else:
            rgb = rgb.copy()
        classes = self._crop(lambda i, j: self._tile(i, j).classes, x0, y0)
        t = self.t
        ys, xs = np.mgrid[y0 : y0 + SIZE, x0 : x0 + SIZE]
        # 1. water shimmer
        water = classes <= scenes.SHALLOW
        shimmer = 1.0 + 0.14 * np.sin(0.45 * xs + 0.3 * ys + 0.35 * t)
        rgb[water] *= shimmer[water][:, None]
        # 2. drifting cloud shadows
        # computed at half resolution: the shadows are smooth at this scale
        cloud = _value_noise(xs[::2, ::2] - 0.6 * t, ys[::2, ::2] - 0.25 * t, 40.0, self.seed + 7)
        cloud = cloud.repeat(2, axis=0).repeat(2, axis=1)
        strength = scenes.SCENES[self.scene]["cloud"]
        rgb *= (1.0 - strength * np.clip(cloud - 0.55, 0, None) * 1.6)[..., None]
        # 3. wandering creatures
        self._draw_creatures(rgb, x0, y0, t)
        # 4. the player sprite, facing its direction of motion
        self._draw_player(rgb)
        return np.clip(rgb, 0, 255).astype(np.uint8)

    def _draw_creatures(self, rgb: np.ndarray, x0: int, y0: int, t: int) -> None:
        colour = np.asarray(scenes.SCENES[self.scene]["creature"], np.float32)
        c0x, c0y = (x0 - 16) // CREATURE_CELL, (y0 - 16) // CREATURE_CELL
        cx, cy = np.meshgrid(np.arange(c0x, c0x + 4), np.arange(c0y, c0y + 4))
        r = [_hash(cx, cy, self.seed + 10 + k) for k in range(5)]
        for k in np.flatnonzero((r[0] > 0.45).ravel()):
            hx = cx.ravel()[k] * CREATURE_CELL + 16 + r[1].ravel()[k] * 32
            hy = cy.ravel()[k] * CREATURE_CELL + 16 + r[2].ravel()[k] * 32
            px = int(hx + 12 * np.sin(0.06 * t + 6.28 * r[3].ravel()[k])) - x0
            py = int(hy + 12 * np.cos(0.045 * t + 6.28 * r[4].ravel()[k])) - y0
            for radius, shade in ((2, 0.45), (1, 1.0)):
                ya, yb = max(py - radius, 0), min(py + radius + 1, SIZE)
                xa, xb = max(px - radius, 0), min(px + radius + 1, SIZE)
                if ya < yb and xa < xb:
                    rgb[ya:yb, xa:xb] = colour * shade

    def _draw_player(self, rgb: np.ndarray) -> None:
        c, h = SIZE // 2, SPRITE // 2
        rgb[c - h : c + h + 1, c - h : c + h + 1] = (20, 20, 20)
        rgb[c - h + 1 : c + h, c - h + 1 : c + h] = (230, 60, 50)
        fx, fy = self.facing
        ex, ey = c + 3 * fx, c + 3 * fy
        rgb[ey - 1 : ey + 2, ex - 1 : ex + 2] = (250, 240, 80)


def player_mask(size: int = SIZE, margin: int = 2) -> np.ndarray:
    """Boolean ``(size, size)`` mask of the player sprite (plus ``margin`` px), for metrics that
    must ignore it (the sprite stays centred while the world moves)."""
    mask = np.zeros((size, size), bool)
    c, h = size // 2, SPRITE // 2 + margin
    mask[c - h : c + h + 1, c - h : c + h + 1] = True
    return mask

"""The avatar world: a stylised head-and-shoulders character at 128×128, drawn procedurally
(anti-aliased ellipses and bands in numpy, no assets), steered frame by frame.

State (all continuous, eased toward targets like a rigged character, one update per frame):
head yaw/pitch in [-1, 1] (toward the held arrow keys, back to centre when released), gaze,
eyelids (blinks), mouth openness and width (the viseme of the frame, plus the expression's own),
and the expression's face parameters (brows raised/tilted, eyes open, mouth corners). Idle
motion: breathing (shoulders), a slow micro sway of the head, blinks every 2-5 s and gaze
saccades, all drawn from the world seed, so the same seed and actions give identical frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldstream.engine.worlds.actions import action_to_direction
from worldstream.engine.worlds.avatar.actions import EXPRESSIONS, decode_action
from worldstream.engine.worlds.avatar.looks import LOOK_NAMES, Appearance, appearance
from worldstream.engine.worlds.avatar.visemes import VISEME_OPEN, VISEME_WIDTH

SIZE = 128
#: per-frame easing rates (fraction of the gap to the target closed each frame)
HEAD_RATE, FACE_RATE, MOUTH_RATE, GAZE_RATE = 0.25, 0.3, 0.7, 0.5
#: the rig's geometry: the head's centre at rest (px), how far the head outline moves at full
#: yaw / pitch (px per unit pose), and how much farther the face features move on the outline
HEAD_CENTRE = (64.0, 52.0)
HEAD_RADII = (24.0, 29.0)
HEAD_SHIFT = (7.0, 5.0)
FEATURE_SHIFT = (9.0, 6.0)
BLINK_PROFILE = (0.5, 1.0, 1.0, 0.5)  # eyelid closure over a blink's frames
BREATH_PERIOD = 70  # frames
#: face parameters of each expression: brow raise, brow tilt (inner ends down), eye opening,
#: mouth curve (corners up > 0), jaw opening, mouth width
FACE_PARAMS = ("brow_raise", "brow_tilt", "eye_open", "mouth_curve", "jaw", "mouth_width")
EXPRESSIONFACE_TABLE: dict[str, tuple[float, ...]] = {
    "neutral": (0.0, 0.0, 1.0, 0.0, 0.0, 1.0),
    "smile": (0.3, 0.0, 0.75, 1.0, 0.1, 1.25),
    "surprise": (1.0, -0.2, 1.4, 0.0, 0.6, 0.7),
    "frown": (-0.7, 1.0, 0.9, -1.0, 0.0, 0.95),
    "sleepy": (-0.3, -0.4, 0.3, -0.1, 0.0, 0.9),
}
#: ``(NUM_EXPRESSIONS, len(FACE_PARAMS))`` float32, rows in ``EXPRESSIONS`` order
FACE_TABLE = np.array([EXPRESSIONFACE_TABLE[e] for e in EXPRESSIONS], np.float32)


@dataclass
class AvatarPose:
    """The character's continuous state after a frame (what the frame shows)."""

    yaw: float
    pitch: float
    gaze: tuple[float, float]
    blink: float  # eyelid closure 0 (open) - 1 (shut)
    mouth_open: float  # 0-1 (plus the expression's jaw)
    mouth_width: float
    face: tuple[float, ...]  # FACE_PARAMS values


def _ellipse_alpha(xs, ys, cx, cy, rx, ry, angle: float = 0.0) -> np.ndarray:
    """Anti-aliased coverage ``(H, W)`` float32 of an ellipse (approximate signed distance
    through the 1-px edge)."""
    dx, dy = xs - cx, ys - cy
    if angle:
        c, s = np.cos(angle), np.sin(angle)
        dx, dy = c * dx + s * dy, -s * dx + c * dy
    r = np.sqrt((dx / rx) ** 2 + (dy / ry) ** 2)
    return np.clip((1.0 - r) * min(rx, ry) + 0.5, 0.0, 1.0)


def _paint(rgb: np.ndarray, alpha: np.ndarray, colour) -> None:
    a = alpha[..., None]
    rgb *= 1.0 - a
    rgb += a * np.asarray(colour, np.float32)


class AvatarSimulator:
    """One episode of the avatar world.

    Args:
        seed: world seed (the character's jitter, idle motion).
        look: one of ``looks.LOOK_NAMES`` (KeyError otherwise).
    ``step(action)`` takes an avatar action id (``avatar.actions``) and returns the new frame,
    ``(128, 128, 3)`` uint8 RGB; ``pose`` is the state it shows.
    """

    def __init__(self, seed: int = 0, look: str = "office"):
        self.seed = int(seed)
        self.look = look
        self.appearance: Appearance = appearance(look, self.seed, SIZE)
        self._rng = np.random.default_rng([self.seed, 11])
        self.t = 0
        self.yaw = self.pitch = 0.0
        self.gaze = np.zeros(2)
        self._gaze_target = np.zeros(2)
        self._next_saccade = int(self._rng.integers(20, 60))
        self._next_blink = int(self._rng.integers(40, 100))
        self._blink_frame = -1
        self.face = FACE_TABLE[0].astype(np.float64)
        self.mouth_open, self.mouth_width = 0.0, 1.0
        self._phase = self._rng.uniform(0, 2 * np.pi, 3)
        ys, xs = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
        self._xs, self._ys = xs, ys

    def set_look(self, look: str) -> None:
        """Switch the character and scene to ``look`` (same seed), from the next frame on;
        KeyError naming an unknown look (nothing changes)."""
        self.appearance = appearance(look, self.seed, SIZE)
        self.look = look

    @property
    def pose(self) -> AvatarPose:
        blink = BLINK_PROFILE[self._blink_frame] if self._blink_frame >= 0 else 0.0
        return AvatarPose(self.yaw, self.pitch, (float(self.gaze[0]), float(self.gaze[1])),
                          blink, self.mouth_open, self.mouth_width,
                          tuple(float(v) for v in self.face))

    def step(self, action: int) -> np.ndarray:
        """Apply one frame's avatar action id and render the new frame (ValueError, nothing
        changed, for an id out of range)."""
        direction, expression, viseme = decode_action(action)
        dx, dy = action_to_direction(direction)
        self.t += 1
        t = self.t
        # 1. head: toward the held direction, plus a slow sway
        sway = 0.04 * np.sin(2 * np.pi * t / 90 + self._phase[0])
        nod = 0.03 * np.sin(2 * np.pi * t / 130 + self._phase[1])
        self.yaw += HEAD_RATE * (dx + sway - self.yaw)
        self.pitch += HEAD_RATE * (dy + nod - self.pitch)
        # 2. face: the expression's parameters; the mouth: the viseme on top of the jaw
        self.face += FACE_RATE * (FACE_TABLE[expression] - self.face)
        self.mouth_open += MOUTH_RATE * (float(VISEME_OPEN[viseme]) - self.mouth_open)
        self.mouth_width += MOUTH_RATE * (float(VISEME_WIDTH[viseme]) - self.mouth_width)
        # 3. eyes: saccades (the eyes lead a head turn), blinks
        if t >= self._next_saccade:
            self._gaze_target = self._rng.uniform(-0.5, 0.5, 2)
            self._next_saccade = t + int(self._rng.integers(20, 60))
        lead = np.array([0.6 * dx, 0.5 * dy])
        self.gaze += GAZE_RATE * (np.clip(self._gaze_target + lead, -1, 1) - self.gaze)
        if self._blink_frame >= 0:
            self._blink_frame += 1
            if self._blink_frame >= len(BLINK_PROFILE):
                self._blink_frame = -1
        if t >= self._next_blink:
            self._blink_frame = 0
            self._next_blink = t + int(self._rng.integers(40, 100))
        return self.render()

    def render(self) -> np.ndarray:
        """The current frame, ``(128, 128, 3)`` uint8 RGB (no state change)."""
        app, xs, ys = self.appearance, self._xs, self._ys
        rgb = app.background.copy()
        breath = 1.2 * np.sin(2 * np.pi * self.t / BREATH_PERIOD + self._phase[2])
        yaw, pitch = self.yaw, self.pitch
        brow_raise, brow_tilt, eye_open, curve, jaw, width = self.face
        cx = HEAD_CENTRE[0] + HEAD_SHIFT[0] * yaw
        cy = HEAD_CENTRE[1] + HEAD_SHIFT[1] * pitch + 0.4 * breath
        rx, ry = HEAD_RADII[0] * app.face_width * (1 - 0.08 * abs(yaw)), HEAD_RADII[1]
        # 1. shoulders and neck
        _paint(rgb, _ellipse_alpha(xs, ys, 64 + 2 * yaw, 140 + breath, 54, 40), app.shirt)
        neck = (np.abs(xs - (64 + 3 * yaw)) < 9) & (ys > cy + 18) & (ys < 112 + breath)
        _paint(rgb, neck.astype(np.float32), app.skin * 0.85)
        # 2. hair behind the head (long hair falls to the shoulders), the head
        if app.hair_style == "long":
            back = _ellipse_alpha(xs, ys, cx - 2 * yaw, cy + 12, rx + 6, ry + 14)
            _paint(rgb, back, app.hair)
        _paint(rgb, _ellipse_alpha(xs, ys, cx - 1.5 * yaw, cy - 3, rx + 3, ry + 2), app.hair)
        if app.hair_style == "bun":
            _paint(rgb, _ellipse_alpha(xs, ys, cx - 4 * yaw, cy - ry - 5, 10, 8), app.hair)
        _paint(rgb, _ellipse_alpha(xs, ys, cx, cy, rx, ry), app.skin)
        # 3. fringe: the hair over the top of the forehead
        fringe = _ellipse_alpha(xs, ys, cx - 2 * yaw, cy - 16, rx + 1, 15)
        fringe *= np.clip(cy - 13 + 3 * np.cos((xs - cx) / 5) - ys, 0, 1)
        _paint(rgb, fringe, app.hair)
        # 4. face features, shifted toward the turn (features move more than the outline)
        fx, fy = cx + FEATURE_SHIFT[0] * yaw, cy + FEATURE_SHIFT[1] * pitch
        blink = BLINK_PROFILE[self._blink_frame] if self._blink_frame >= 0 else 0.0
        for side in (-1, 1):
            squash = 1 - 0.3 * yaw * side  # the eye on the far side of the turn narrows
            ex, ey = fx + side * 9.5 * squash, fy - 3
            open_ry = max(3.6 * eye_open * (1 - blink), 0.35)
            eye = _ellipse_alpha(xs, ys, ex, ey, 5 * squash, open_ry)
            _paint(rgb, eye, (250, 250, 250))
            iris = _ellipse_alpha(xs, ys, ex + 2.5 * self.gaze[0], ey + 1.5 * self.gaze[1],
                                  2.6, 2.6) * eye
            _paint(rgb, iris, (40, 30, 25))
            by = ey - 7 - 3 * brow_raise + 1.0 * brow_tilt
            brow = _ellipse_alpha(xs, ys, ex, by, 6 * squash, 1.6, side * 0.35 * brow_tilt)
            _paint(rgb, brow, app.hair * 0.6)
            if app.glasses:
                ring = _ellipse_alpha(xs, ys, ex, ey, 7.5 * squash, 6.2) - _ellipse_alpha(
                    xs, ys, ex, ey, 6.2 * squash, 4.9)
                _paint(rgb, np.clip(ring, 0, 1), (30, 30, 35))
        if app.glasses:
            bridge = (np.abs(xs - fx) < 3) & (np.abs(ys - (fy - 4)) < 0.8)
            _paint(rgb, bridge.astype(np.float32), (30, 30, 35))
        _paint(rgb, _ellipse_alpha(xs, ys, fx + 2 * yaw, fy + 5, 2.4, 3.2), app.skin * 0.8)
        self._draw_mouth(rgb, fx, fy + 14, curve, min(jaw + self.mouth_open, 1.2),
                         width * self.mouth_width)
        # 5. hat
        if app.hat is not None:
            self._draw_hat(rgb, cx, cy, rx, ry, yaw)
        return np.clip(rgb, 0, 255).astype(np.uint8)

    def _draw_mouth(self, rgb, mx, my, curve, opening, width) -> None:
        xs, ys = self._xs, self._ys
        w = 8.0 * width
        u = (xs - mx) / w
        centre = my - 3.0 * curve * (u * u - 0.33)
        h = 7.0 * opening
        inside = np.clip((1 - np.abs(u)) * w + 0.5, 0, 1)
        top, bottom = centre - h / 2 - 1.0, centre + h / 2 + 1.0
        lips = np.clip(np.minimum(ys - top, bottom - ys) + 0.5, 0, 1) * inside
        _paint(rgb, lips, (170, 60, 60))
        if h > 0.8:
            hole = np.clip(np.minimum(ys - (centre - h / 2), centre + h / 2 - ys) + 0.5, 0, 1)
            _paint(rgb, hole * np.clip((0.85 - np.abs(u)) * w + 0.5, 0, 1), (60, 15, 20))

    def _draw_hat(self, rgb, cx, cy, rx, ry, yaw) -> None:
        xs, ys = self._xs, self._ys
        app = self.appearance
        colour = app.hat_colour
        if app.hat == "sunhat":
            _paint(rgb, _ellipse_alpha(xs, ys, cx - yaw, cy - 20, rx + 18, 6), colour)
            crown = _ellipse_alpha(xs, ys, cx - yaw, cy - 24, rx - 2, 12)
            _paint(rgb, crown * (ys < cy - 20), colour * 0.9)
        else:
            crown = _ellipse_alpha(xs, ys, cx - 1.5 * yaw, cy - 14, rx + 3, ry - 6)
            _paint(rgb, crown * np.clip(cy - 17 - ys + 0.5, 0, 1), colour)
            if app.hat == "beanie":
                band = (np.abs(ys - (cy - 18)) < 2.5) & (np.abs(xs - cx) < rx + 2)
                _paint(rgb, band.astype(np.float32), colour * 0.8)
            else:  # cap: a brim toward the turn
                brim = _ellipse_alpha(xs, ys, cx + 14 * yaw, cy - 17, rx * 0.8, 3.5)
                _paint(rgb, brim, colour * 0.75)


def backdrop(look: str, seed: int) -> np.ndarray:
    """``(128, 128, 3)`` uint8: the background plate of ``look`` for world ``seed`` (what every
    frame of that character shows where the character is not). KeyError naming an unknown
    look."""
    return np.clip(appearance(look, seed, SIZE).background, 0, 255).astype(np.uint8)


def scene_backdrop(scene: int, seed: int) -> np.ndarray:
    """:func:`backdrop` of the look with index ``scene`` in ``LOOK_NAMES`` (a shard's ``scene``
    column). IndexError for an index out of range."""
    return backdrop(LOOK_NAMES[scene], seed)

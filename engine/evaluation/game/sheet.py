"""The side-by-side sheet of a game world: its free play over the game's, same keys, each
frame's moving objects (``game_objects``) outlined in a colour the frame does not show."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from worldstream.engine.evaluation.game import objects as go  # noqa: E402
from worldstream.engine.worlds.game.frames import colour_codes  # noqa: E402

#: outline colours to pick from: the one farthest from every colour of the frame
_OUTLINE_COLOURS = np.array([[255, 0, 255], [0, 255, 255], [255, 255, 0], [255, 255, 255],
                             [0, 0, 0]], np.uint8)


def outline_objects(prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """``cur`` (``(H, W, 3)`` uint8) with a 1-px outline around each moving object of
    ``prev -> cur``, in the colour of ``_OUTLINE_COLOURS`` farthest from every colour of
    ``cur``."""
    _, index = np.unique(colour_codes(np.stack([prev, cur])), return_inverse=True)
    index = index.reshape(2, *cur.shape[:2])
    objects = go.moving_objects(index[:1], index[1:])
    ring = go.outline(objects.labels)[0]
    shown = np.unique(cur.reshape(-1, 3), axis=0).astype(np.int32)
    dist = ((_OUTLINE_COLOURS[:, None].astype(np.int32) - shown[None]) ** 2).sum(-1).min(1)
    out = cur.copy()
    out[ring] = _OUTLINE_COLOURS[dist.argmax()]
    return out


def save_game_sheet(model: np.ndarray, env: np.ndarray, out: str | Path, title: str,
                    start: int = 0, frames: int = 240, columns: int = 9,
                    moments: int = 3) -> Path:
    """Rows of (model, game) frame pairs: ``moments`` stretches of ``frames`` frames spread
    over the free play, ``columns`` frames each, moving objects outlined (against each clip's
    frame before). ``model``/``env``: ``(T, H, W, 3)`` uint8."""
    span = len(model) - start
    firsts = [start + int(i * max(span - frames, 0) / max(moments - 1, 1))
              for i in range(moments)]
    fig, axes = plt.subplots(2 * moments, columns, figsize=(1.3 * columns, 2.7 * moments),
                             squeeze=False)
    for m, first in enumerate(firsts):
        picks = [min(first + int(k * frames / (columns - 1)), len(model) - 1)
                 for k in range(columns)]
        for col, t in enumerate(picks):
            _draw_pair(axes, m, col, t, model, env, f"frame {t}", 8)
    return _save(fig, out, title, dpi=90)


def _draw_pair(axes, band: int, col: int, t: int, model: np.ndarray, game: np.ndarray,
               label: str, fontsize: int) -> None:
    """Frame ``t`` of the model over the game's in column ``col`` of band ``band`` (rows
    ``2 * band`` and ``2 * band + 1``), moving objects outlined, titled ``label``."""
    for row, (clip, name) in enumerate(((model, "model"), (game, "game"))):
        ax = axes[2 * band + row][col]
        ax.set_axis_on()
        shown = clip[t] if t == 0 else outline_objects(clip[t - 1], clip[t])
        ax.imshow(shown, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if col == 0:
            ax.set_ylabel(name, fontsize=fontsize)
    axes[2 * band][col].set_title(label, fontsize=7)


def _save(fig, out: str | Path, title: str, dpi: int) -> Path:
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def save_played_sheet(model: np.ndarray, game: np.ndarray, out: str | Path, title: str,
                      fps: int, start: int = 0, columns: int = 15) -> Path:
    """One frame a second from the session's first played frame (``start``): bands of
    ``columns`` seconds, the model's frames over the game's, moving objects outlined.
    ``model``/``game``: ``(T, H, W, 3)`` uint8 of one session, the same actions."""
    picks = list(range(start, len(model), fps))
    bands = -(-len(picks) // columns)
    fig, axes = plt.subplots(2 * bands, columns, figsize=(1.05 * columns, 2.25 * bands),
                             squeeze=False)
    for ax in axes.ravel():
        ax.set_axis_off()
    for i, t in enumerate(picks):
        band, col = divmod(i, columns)
        _draw_pair(axes, band, col, t, model, game, f"{(t - start) / fps:.0f} s", 7)
    return _save(fig, out, title, dpi=80)

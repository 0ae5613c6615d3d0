"""The side-by-side sheet of a game world: its free play over the game's, same keys."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def save_game_sheet(model: np.ndarray, env: np.ndarray, out: str | Path, title: str,
                    start: int = 0, frames: int = 240, columns: int = 9,
                    moments: int = 3) -> Path:
    """Rows of (model, game) frame pairs: ``moments`` stretches of ``frames`` frames spread
    over the free play, ``columns`` frames each. ``model``/``env``: ``(T, H, W, 3)`` uint8."""
    span = len(model) - start
    firsts = [start + int(i * max(span - frames, 0) / max(moments - 1, 1))
              for i in range(moments)]
    fig, axes = plt.subplots(2 * moments, columns, figsize=(1.3 * columns, 2.7 * moments),
                             squeeze=False)
    for m, first in enumerate(firsts):
        picks = [min(first + int(k * frames / (columns - 1)), len(model) - 1)
                 for k in range(columns)]
        for col, t in enumerate(picks):
            for row, (clip, name) in enumerate(((model, "model"), (env, "game"))):
                ax = axes[2 * m + row][col]
                ax.imshow(clip[t], interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
                if col == 0:
                    ax.set_ylabel(name, fontsize=8)
            axes[2 * m][col].set_title(f"frame {t}", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out

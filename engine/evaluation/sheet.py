"""The side-by-side sheet: the model's frames and the simulator's on the same action script, at
several moments of one rollout, in one PNG (``worldstream eval --sheet out.png``), so anyone can
see what the evaluation numbers mean."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from worldstream.engine.backends.builtin import BuiltinBackend  # noqa: E402
from worldstream.engine.evaluation.episodes import record, rollout  # noqa: E402
from worldstream.engine.evaluation.metrics import (  # noqa: E402
    anisotropy,
    boundary_density,
    sharpness,
)
from worldstream.engine.models.builtin import text as text_encoder  # noqa: E402

MOMENTS = (0, 10, 20, 40, 70, 100, 140, 180, 230)


def side_by_side(
    gen: BuiltinBackend,
    actions: list[int],
    prompt: str,
    switches: dict[int, str] | None = None,
    seed: int = 900_500,
    steps: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    """The model's free rollout and the simulator's frames for per-frame ``actions`` from the
    same start (the simulator's first chunk at world ``seed`` in the prompt's scene);
    ``switches`` maps a frame index to a new prompt. Returns two ``(L, H, W, 3)`` uint8
    arrays (model, simulator)."""
    f = gen.chunk_frames
    scene = text_encoder.scene_for_prompt(prompt)
    scene_switches = {i: text_encoder.scene_for_prompt(p) for i, p in (switches or {}).items()}
    ep = record(seed, len(actions) // f * f, scene, scene_switches, actions)
    ep.prompt = prompt
    chunk_switches = {i // f: p for i, p in (switches or {}).items()}
    return rollout(gen, ep, steps, seed, chunk_switches), ep.frames


def frame_label(model: np.ndarray, sim: np.ndarray, classes: np.ndarray | None = None) -> str:
    """A sheet column's label for a model frame and the simulator's, both ``(H, W, 3)``
    uint8: the model's sharpness over the simulator's, its anisotropy and, given the scene's
    terrain ``classes`` (``(K, 3)``), its boundary density over the simulator's."""
    ratio = sharpness(model) / max(sharpness(sim), 1e-9)
    label = f"sharp {ratio:.2f}\naniso {anisotropy(model):.2f}"
    if classes is not None:
        frag = boundary_density(model, classes) / max(boundary_density(sim, classes), 1e-9)
        label += f"\nfrag {frag:.2f}"
    return label


def save_sheet(
    model: np.ndarray,
    sim: np.ndarray,
    out: str | Path,
    title: str,
    moments: tuple[int, ...] = MOMENTS,
    classes: np.ndarray | None = None,
) -> Path:
    """Write the sheet: the model's frames (top row) over the simulator's (bottom row) at
    ``moments`` (frame indices), each labelled with its frame index, the model frame's
    sharpness relative to the simulator's, its gradient anisotropy and, given the scene's
    terrain ``classes`` (``(K, 3)`` class colours, ``engine.worlds.scenes.palette``), its
    terrain-class boundary density relative to the simulator's (``frag``:
    ``metrics.boundary_density``). Returns the path (PNG)."""
    moments = tuple(m for m in moments if m < len(model))
    fig, axes = plt.subplots(2, len(moments), figsize=(1.6 * len(moments), 3.7), squeeze=False)
    for col, m in enumerate(moments):
        for row, (frames, name) in enumerate(((model, "model"), (sim, "simulator"))):
            ax = axes[row][col]
            ax.imshow(frames[m], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(name)
        axes[0][col].set_title(f"frame {m}", fontsize=8)
        axes[1][col].set_xlabel(frame_label(model[m], sim[m], classes), fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

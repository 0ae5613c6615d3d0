"""The spatial memory's side of a chunk: the ``remember`` stage writes its frames where they
were shown, a rewind undoes the writes, and the references the detail limit and the colour
anchor hold generated ground to are taken from real frames."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from worldstream.engine.backends.builtin.state import BuiltinState, ChunkRecord
from worldstream.engine.backends.stages import ChunkBatch
from worldstream.engine.models.builtin import text as text_encoder
from worldstream.engine.worlds.actions import IDLE
from worldstream.engine.worlds.simulator import WorldSimulator

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner


def remember(backend: BuiltinRunner, batch: ChunkBatch) -> None:
    """Stage (after delivery): each chunk's frames into its state's spatial memory."""
    for state, rec, frames in zip(batch.states, batch.records, batch.frames):
        write(backend, state, rec, frames)


def write(backend: BuiltinRunner, state: BuiltinState, rec: ChunkRecord, frames: np.ndarray,
          settled: bool = False) -> None:
    """Write a chunk's frames ``(F, H, W, 3)`` uint8 into the state's memory at the chunk's
    windows (the centred player sprite excluded), keeping the undo records on ``rec``;
    ``settled`` for real frames (final up to their border)."""
    for (x0, y0), rgb in zip(rec.origins, frames):
        rec.undo.append(state.memory.write(x0, y0, rgb, backend.exclude, settled=settled))


def undo(state: BuiltinState, rec: ChunkRecord) -> None:
    """Take a rewound chunk's writes back out of memory, newest first."""
    for record in reversed(rec.undo):
        state.memory.undo(record)


def simulated_start(backend: BuiltinRunner, prompt: str, seed: int) -> np.ndarray:
    """Simulator frames ``(chunk_frames, H, W, 3)`` uint8 of the prompt's nearest scene at
    world ``seed``, the camera at rest: a stream's default start."""
    sim = WorldSimulator(seed, text_encoder.scene_for_prompt(prompt))
    return np.stack([sim.step(IDLE) for _ in range(backend.chunk_frames)])


def set_references(backend: BuiltinRunner, state: BuiltinState, frames: np.ndarray,
                   latents=None) -> None:
    """The stream's detail and colour references from real frames ``(F, H, W, 3)`` uint8
    (those switched off stay None): the RMS of what the autoencoder loses on them, and their
    mean colour shrunk by the colour prior toward the scene of ``state.reference_prompt``;
    ``latents``: their encoding when the caller has it."""
    cfg = backend.config
    if cfg.refining_detail_cap is not None:
        if latents is None:
            latents = backend.encode_frames(frames)
        lost = frames.astype(np.float32) - backend.decode_latents(latents)
        state.detail_reference = float(np.sqrt(np.mean(np.square(lost))))
    if cfg.colour_anchor is not None:
        view = frames.reshape(-1, 3).mean(axis=0, dtype=np.float64)
        prior = cfg.colour_prior
        state.colour_reference = (view if prior is None else prior.reference(
            view, text_encoder.scene_for_prompt(state.reference_prompt)))

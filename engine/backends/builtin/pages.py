"""The ``select_pages`` stage: the KV pages each chunk attends besides its own.

The sink and the recency window (less window frames whose rig pose is too far from the new
chunk's: ``BuiltinConfig.window_pose_tolerance``), then older pages whose frame's camera
window overlaps the new view most (``spatial_pages``: revisited places come back into the
attention context long after they left the window), then, with ``topk_pages``, the older
pages the attention may pick by key similarity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from worldstream.engine.backends.builtin.state import BuiltinState, ChunkRecord
from worldstream.engine.backends.stages import ChunkBatch, attend
from worldstream.engine.models.builtin.spatial_memory import select_by_overlap

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner


def select_pages(backend: BuiltinRunner, batch: ChunkBatch) -> None:
    """Stage: each row's attended pages, then the batch's attention context."""
    attend(backend, batch, [attended(backend, s, r) + spatial_pages(backend, s, r.origins)
                            for s, r in zip(batch.states, batch.records)])


def attended(backend: BuiltinRunner, state: BuiltinState, record: ChunkRecord) -> list[int]:
    """The sink and window pages, less the window frames posed more than
    ``window_pose_tolerance`` from the new chunk's first frame (a model with a rig)."""
    pages = state.table.attended_pages()
    tol = backend.config.window_pose_tolerance
    if tol is None or record.poses is None:
        return pages
    f = backend.pages_per_chunk
    window = state.table.window_pages()
    chunks = len(window) // f
    # the table and the history hold the same chunks, newest last
    recs = list(state.history)[-chunks:] if chunks else []
    far = {p for n, rec in enumerate(recs)
           if rec.poses is not None
           and np.abs(rec.poses - record.poses[0]).max() > tol + 1e-9
           for p in window[n * f:(n + 1) * f]}
    return [p for p in pages if p not in far]


def spatial_pages(backend: BuiltinRunner, state: BuiltinState, origins: np.ndarray) -> list[int]:
    """Up to ``spatial_pages`` older pages whose frame's camera window overlaps the view at
    ``origins[-1]`` most (overlap > 0), oldest first."""
    k = backend.config.spatial_pages
    older = state.table.older_pages()
    if not k or not older:
        return []
    f = backend.chunk_frames
    # the table and the history hold the same chunks, newest last; older pages are the
    # chunks before the window
    recs = list(state.history)[-(len(older) // f + state.table.window_chunks):]
    page_origins = [o for rec in recs[:len(older) // f] for o in rec.origins]
    return select_by_overlap(older, page_origins, origins[-1], backend.width, k)

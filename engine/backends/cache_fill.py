"""Writing chunks into the KV cache outside the denoise loop: the cache fill (one forward of
clean chunks labelled with the context noise level, whose keys/values later chunks attend
to), appending real frames (start frames, observed ones) and the recache of the window under
a new prompt (copy-on-write: a fork sharing the old pages keeps them)."""

from __future__ import annotations

from typing import Any

import torch

from worldstream.engine.core.api import CapacityError

#: seconds a client is told to wait when the KV page pool is exhausted
POOL_RETRY_S = 2.0


def fill(runner: Any, states: list, records: list, pages: list[list[int]],
         contexts: list[list[int]]) -> None:
    """One forward of the records' clean latents at ``ctx_sigma`` into ``pages``, each row
    attending ``contexts``; each record keeps what it consumed (``context``)."""
    cfg = runner.config
    for state, rec in zip(states, records):
        if rec.context is None:
            rec.context = rec.latents
            if cfg.ctx_noise and cfg.ctx_sigma > 0:
                # real noise at the context level (GameNGen/DIAMOND): the model then treats
                # its own past output as uncertain, as in training, instead of trusting it
                eps = torch.randn(rec.latents.shape, generator=state.rng)
                rec.context = (1 - cfg.ctx_sigma) * rec.latents + cfg.ctx_sigma * eps
    x = torch.stack([r.context for r in records]).to(runner.device)
    runner.forward(x, cfg.ctx_sigma, runner.conditioning(states, records),
                    runner.attention_context(pages, contexts, attention=states[0].attention))


def append(runner: Any, state: Any, records: list) -> None:
    """Cache-fill ``records`` one after the other and append them to the state (start
    frames, observed frames). CapacityError when the pool is out of pages."""
    for rec in records:
        pages = runner.allocator.allocate(runner.pages_per_chunk)
        if pages is None:
            raise CapacityError("KV page pool exhausted", POOL_RETRY_S)
        with runner.returned_on_failure([pages]):
            fill(runner, [state], [rec], [pages], [state.table.attended_pages()])
        state.table.append_chunk(pages)
        state.history.append(rec)


def recache(runner: Any, state: Any) -> None:
    """Recompute the window's keys/values under the state's current conditioning into fresh
    pages and swap them in. CapacityError when the pool has no pages for it."""
    f = runner.pages_per_chunk
    window = state.table.window_pages()
    num_chunks = len(window) // f
    records = list(state.history)[-num_chunks:] if num_chunks else []
    for n, rec in enumerate(records):
        pages = runner.allocator.allocate(f)
        if pages is None:
            raise CapacityError("KV page pool exhausted", POOL_RETRY_S)
        old = window[n * f:(n + 1) * f]
        with runner.returned_on_failure([pages]):
            fill(runner, [state], [rec], [pages], [state.table.sink_pages() + window[:n * f]])
        for o, p in zip(old, pages):
            state.table.replace_page(o, p)
        window[n * f:(n + 1) * f] = pages
    state.needs_recache = False

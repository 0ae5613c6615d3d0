"""The paged part of a state loaded from a save point, shared by the paged backends (the
built-in model, Matrix-Game): pages taken from the backend's pool, filled with the saved
keys/values (and any pool indexed by the same page ids), laid out in a page table as they
were saved; all given back when what follows fails."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from worldstream.engine.core.api import CapacityError

if TYPE_CHECKING:
    import torch

    from worldstream.engine.core.kv_cache import PageTable


@contextlib.contextmanager
def restored_pages(gen, pools: list[tuple[torch.Tensor, torch.Tensor]],
                   scalars: dict[str, Any], pages_per_chunk: int
                   ) -> Iterator[tuple[PageTable, Any]]:
    """Under the backend's lock (``gen.settled``): ``(table, attention)`` for the saved pages,
    each ``(pool, values)`` pair written at the new page ids (``values``:
    ``(layers, pages, ...)`` in the pool's dtype and device, checked by the caller). The body
    builds the rest of the state; an exception there frees every page taken here.
    CapacityError when the pool has too few free pages (nothing held then)."""
    import torch

    from worldstream import kernels
    from worldstream.engine.core.kv_cache import PageTable

    cfg, f = gen.config, pages_per_chunk
    n = int(scalars["table"]["pages"])
    sink = int(scalars["table"]["sink_pages"])
    with gen.settled():
        pages = gen.allocator.allocate(n) if n else []
        if pages is None:
            raise CapacityError("KV page pool exhausted", 2.0)
        table = PageTable(gen.allocator, pages_per_chunk=f, window_chunks=cfg.window_chunks,
                          sink=cfg.sink, max_chunks=cfg.memory_chunks)
        try:
            if pages:
                idx = torch.tensor(pages, dtype=torch.long, device=pools[0][0].device)
                for pool, values in pools:
                    pool[:, idx] = values
            if sink:
                table.append_chunk(pages[:sink])
            for start in range(sink, n, f):
                table.append_chunk(pages[start:start + f])
            table.num_chunks = int(scalars["table"]["num_chunks"])
            table.window_chunks = int(scalars["window_chunks"])
            attention = scalars["attention"]
            if attention is not None:
                attention = kernels.resolve_backend(str(attention), gen.device)
            yield table, attention
        except BaseException:
            held = set(table.all_pages())
            table.free()
            rest = [p for p in pages if p not in held]  # allocated, not yet in the table
            if rest:
                gen.allocator.decref(rest)
            raise

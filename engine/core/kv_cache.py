"""Bookkeeping of the paged temporal KV cache: page ids, reference counts and page tables.

No tensors here (like nano-vllm's block manager): the model runner owns the page pool tensor
``[num_layers, num_pages, heads, page_size, head_dim]`` and indexes it with the page ids handed
out by :class:`PageAllocator`. A :class:`PageTable` lists one session's (or branch's) pages in
time order, one list of ``pages_per_chunk`` ids per chunk, and implements the attention sink,
the rolling window, eviction, fork (copy-on-write by reference count) and rewind.

Ownership rule: a page id handed to :meth:`PageTable.append_chunk` or
:meth:`PageTable.replace_page` carries one reference that the table takes over (the one
:meth:`PageAllocator.allocate` returned); the table gives it back with ``decref`` when the page
is evicted, rewound, replaced or freed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class PageAllocator:
    """Page ids ``0..num_pages-1`` with reference counts and a free list.

    A shortage is a return value (``allocate`` gives None), never an exception: the caller
    decides whether to refuse a session, wait or degrade.
    """

    def __init__(self, num_pages: int):
        if not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages must be a positive int, got {num_pages!r}")
        self.num_pages = num_pages
        self._refcounts = [0] * num_pages
        # NOTE: FIFO free list, so a just-freed page is reused last; a stale page id that is
        # still read somewhere by mistake then shows old data for longer in tests, not less.
        self._free: deque[int] = deque(range(num_pages))

    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` free page ids with refcount 1, or None (nothing changes) when fewer are free.

        Raises ValueError for a negative ``n``.
        """
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"page count must be a non-negative int, got {n!r}")
        if n > len(self._free):
            return None
        pages = [self._free.popleft() for _ in range(n)]
        for page in pages:
            self._refcounts[page] = 1
        return pages

    def _check_live(self, pages: list[int]) -> None:
        for page in pages:
            if not isinstance(page, int) or not 0 <= page < self.num_pages:
                raise ValueError(f"page id {page!r} outside [0, {self.num_pages})")
            if self._refcounts[page] == 0:
                raise ValueError(f"page {page} is free (refcount 0)")

    def incref(self, pages: Iterable[int]) -> None:
        """One more reference to each page (a page listed twice gets two). ValueError, with
        nothing changed, when a page is out of range or free."""
        pages = list(pages)
        self._check_live(pages)
        for page in pages:
            self._refcounts[page] += 1

    def decref(self, pages: Iterable[int]) -> None:
        """One reference less to each page; a page whose count reaches 0 returns to the free
        list. ValueError, with nothing changed, when a page would go below 0."""
        pages = list(pages)
        self._check_live(pages)
        needed: dict[int, int] = {}
        for page in pages:
            needed[page] = needed.get(page, 0) + 1
        for page, count in needed.items():
            if count > self._refcounts[page]:
                raise ValueError(
                    f"page {page} released {count} times but holds {self._refcounts[page]}"
                )
        for page in pages:
            self._refcounts[page] -= 1
            if self._refcounts[page] == 0:
                self._free.append(page)

    def refcount(self, page: int) -> int:
        if not isinstance(page, int) or not 0 <= page < self.num_pages:
            raise ValueError(f"page id {page!r} outside [0, {self.num_pages})")
        return self._refcounts[page]


class PageTable:
    """One session's (or branch's) pages in time order.

    Args:
        allocator: the pool the pages come from and go back to.
        pages_per_chunk: pages each chunk occupies (e.g. latent frames per chunk × tiles).
        window_chunks: W, the newest chunks always attended.
        sink: pin the first chunk appended as the attention sink (never evicted).
        max_chunks: chunks retained beyond the sink (window + older pages kept for sparse memory
            and rewind); ``>= window_chunks``. Older chunks are evicted and their pages decref'd.
    """

    def __init__(
        self,
        allocator: PageAllocator,
        *,
        pages_per_chunk: int,
        window_chunks: int,
        sink: bool,
        max_chunks: int,
    ):
        if pages_per_chunk < 1:
            raise ValueError(f"pages_per_chunk must be >= 1, got {pages_per_chunk}")
        if window_chunks < 1:
            raise ValueError(f"window_chunks must be >= 1, got {window_chunks}")
        if max_chunks < window_chunks:
            raise ValueError(
                f"max_chunks ({max_chunks}) must be >= window_chunks ({window_chunks})"
            )
        self.allocator = allocator
        self.pages_per_chunk = pages_per_chunk
        self.window_chunks = window_chunks
        self.sink = sink
        self.max_chunks = max_chunks
        self.num_chunks = 0
        self._sink: list[int] = []
        self._chunks: deque[list[int]] = deque()  # retained non-sink chunks, oldest first

    # -- growth ----------------------------------------------------------------------------
    def append_chunk(self, pages: list[int]) -> None:
        """Append the newest chunk (takes over one reference to each page); evicts the oldest
        retained chunk beyond ``max_chunks``. ValueError for a wrong page count or a free page."""
        pages = list(pages)
        if len(pages) != self.pages_per_chunk:
            raise ValueError(f"a chunk has {self.pages_per_chunk} pages, got {len(pages)}")
        self.allocator._check_live(pages)
        if self.sink and self.num_chunks == 0:
            self._sink = pages
        else:
            self._chunks.append(pages)
            if len(self._chunks) > self.max_chunks:
                self.allocator.decref(self._chunks.popleft())
        self.num_chunks += 1

    # -- views -----------------------------------------------------------------------------
    def sink_pages(self) -> list[int]:
        return list(self._sink)

    def window_pages(self) -> list[int]:
        """Pages of the last ``window_chunks`` non-sink chunks, oldest first."""
        start = max(len(self._chunks) - self.window_chunks, 0)
        return [p for i in range(start, len(self._chunks)) for p in self._chunks[i]]

    def attended_pages(self) -> list[int]:
        """Sink + window pages in time order: what every query chunk attends."""
        return self.sink_pages() + self.window_pages()

    def older_pages(self) -> list[int]:
        """Retained pages outside sink and window, oldest first (sparse-memory candidates)."""
        stop = max(len(self._chunks) - self.window_chunks, 0)
        return [p for i in range(stop) for p in self._chunks[i]]

    def all_pages(self) -> list[int]:
        """Every page the table holds a reference to, in time order."""
        return self.sink_pages() + [p for chunk in self._chunks for p in chunk]

    def max_rewind(self) -> int:
        """The most chunks :meth:`rewind` accepts now.

        Rewinding must leave the exact context the stream had back then: the window of that
        moment must still be retained (with nothing evicted, everything may be rewound).
        """
        num_sink = 1 if self._sink else 0
        first_retained = self.num_chunks - len(self._chunks)  # chunk index of the oldest kept
        if first_retained == num_sink:  # nothing evicted yet
            return self.num_chunks
        return max(len(self._chunks) - self.window_chunks, 0)

    # -- branch operations -----------------------------------------------------------------
    def fork(self) -> PageTable:
        """A table sharing every page (each incref'd once): copy-on-write by refcount."""
        twin = PageTable(
            self.allocator,
            pages_per_chunk=self.pages_per_chunk,
            window_chunks=self.window_chunks,
            sink=self.sink,
            max_chunks=self.max_chunks,
        )
        self.allocator.incref(self.all_pages())
        twin.num_chunks = self.num_chunks
        twin._sink = list(self._sink)
        twin._chunks = deque(list(chunk) for chunk in self._chunks)
        return twin

    def rewind(self, n_chunks: int) -> None:
        """Drop the newest ``n_chunks`` chunks (decref). ValueError, with nothing changed, for
        a negative count or one beyond :meth:`max_rewind`. The sink goes only with everything."""
        if not isinstance(n_chunks, int) or n_chunks < 0:
            raise ValueError(f"rewind count must be a non-negative int, got {n_chunks!r}")
        limit = self.max_rewind()
        if n_chunks > limit:
            raise ValueError(f"cannot rewind {n_chunks} chunks; {limit} are retained")
        for _ in range(n_chunks):
            if self._chunks:
                self.allocator.decref(self._chunks.pop())
            else:
                self.allocator.decref(self._sink)
                self._sink = []
            self.num_chunks -= 1

    def replace_page(self, old: int, new: int) -> None:
        """Swap page id ``old`` for ``new`` in place (copy-on-write for a recache): the table
        takes over one reference to ``new`` and releases its reference to ``old``.
        ValueError, with nothing changed, when ``old`` is not in the table or ``new`` is free."""
        self.allocator._check_live([new])
        for chunk in (self._sink, *self._chunks):
            if old in chunk:
                chunk[chunk.index(old)] = new
                self.allocator.decref([old])
                return
        raise ValueError(f"page {old} is not in this page table")

    def free(self) -> None:
        """Release every page; the table becomes empty. Idempotent."""
        pages = self.all_pages()
        self._sink = []
        self._chunks.clear()
        self.num_chunks = 0
        self.allocator.decref(pages)


def allocate_chunks(
    allocator: PageAllocator, num_jobs: int, pages_per_chunk: int
) -> tuple[list[int], list[list[int]]]:
    """One chunk's pages for each of ``num_jobs`` jobs while the pool lasts.

    Returns ``(served, pages)``: the indices of the jobs that got pages, in order, and their
    page lists. The others are short; the caller reports them (a shortage is a return value).
    """
    served: list[int] = []
    pages: list[list[int]] = []
    for i in range(num_jobs):
        got = allocator.allocate(pages_per_chunk)
        if got is not None:
            served.append(i)
            pages.append(got)
    return served, pages

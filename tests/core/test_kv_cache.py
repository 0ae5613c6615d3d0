"""Page allocator and page tables: hand-worked cases plus a hypothesis state machine checking
refcounts against the tables that hold the pages, and rewind against recorded history."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from worldstream.engine.core.kv_cache import PageAllocator, PageTable


def _table(alloc, **kw):
    args = dict(pages_per_chunk=2, window_chunks=2, sink=True, max_chunks=3)
    args.update(kw)
    return PageTable(alloc, **args)


def test_allocator_shortage_is_a_return_value():
    alloc = PageAllocator(4)
    assert alloc.allocate(3) == [0, 1, 2]
    assert not alloc.can_allocate(2) and alloc.can_allocate(1)
    assert alloc.allocate(2) is None
    assert alloc.num_free() == 1  # the refused request took nothing
    alloc.incref([1])
    alloc.decref([0, 1])
    assert [alloc.refcount(p) for p in range(4)] == [0, 1, 1, 0]
    assert alloc.num_free() == 2
    with pytest.raises(ValueError, match="free"):
        alloc.decref([0])
    with pytest.raises(ValueError, match="released 2 times"):
        alloc.decref([2, 2])
    assert alloc.refcount(2) == 1  # the bad release changed nothing
    with pytest.raises(ValueError):
        alloc.allocate(-1)
    with pytest.raises(ValueError):
        PageAllocator(0)


def test_sink_window_eviction_hand_worked():
    alloc = PageAllocator(20)
    table = _table(alloc)
    chunks = [alloc.allocate(2) for _ in range(6)]  # pages [0,1], [2,3], ... [10,11]
    for chunk in chunks:
        table.append_chunk(chunk)
    assert table.num_chunks == 6
    assert table.sink_pages() == [0, 1]
    # retained beyond the sink: the newest 3 chunks (max_chunks); chunks 1 and 2 were evicted
    assert table.window_pages() == [8, 9, 10, 11]
    assert table.older_pages() == [6, 7]
    assert table.attended_pages() == [0, 1, 8, 9, 10, 11]
    assert [alloc.refcount(p) for p in (2, 3, 4, 5)] == [0, 0, 0, 0]
    assert alloc.num_free() == 20 - 8
    # the window of 1 chunk ago (chunks 3, 4) is still retained; of 2 chunks ago (2, 3) is not
    assert table.max_rewind() == 1
    with pytest.raises(ValueError, match="cannot rewind 2"):
        table.rewind(2)
    table.rewind(1)
    assert table.num_chunks == 5 and table.attended_pages() == [0, 1, 6, 7, 8, 9]
    assert alloc.refcount(10) == 0
    table.free()
    table.free()  # idempotent
    assert alloc.num_free() == 20 and table.attended_pages() == []


def test_rewind_everything_without_eviction_drops_the_sink_last():
    alloc = PageAllocator(8)
    table = _table(alloc, max_chunks=4)
    for _ in range(3):
        table.append_chunk(alloc.allocate(2))
    assert table.max_rewind() == 3
    table.rewind(2)
    assert table.sink_pages() == [0, 1] and table.window_pages() == []
    table.rewind(1)
    assert table.num_chunks == 0 and alloc.num_free() == 8
    table.append_chunk(alloc.allocate(2))  # the next chunk is the new sink
    assert table.sink_pages() != [] and table.window_pages() == []


def test_fork_shares_pages_until_append_and_replace_page_is_copy_on_write():
    alloc = PageAllocator(16)
    table = _table(alloc)
    for _ in range(3):
        table.append_chunk(alloc.allocate(2))
    twin = table.fork()
    assert twin.attended_pages() == table.attended_pages() == [0, 1, 2, 3, 4, 5]
    assert all(alloc.refcount(p) == 2 for p in range(6))
    twin.append_chunk(alloc.allocate(2))
    assert table.attended_pages() == [0, 1, 2, 3, 4, 5]
    assert twin.attended_pages() == [0, 1, 4, 5, 6, 7]
    # recache of the twin's shared page 4: a private copy replaces it, the original keeps it
    (new,) = alloc.allocate(1)
    twin.replace_page(4, new)
    assert twin.window_pages() == [new, 5, 6, 7] and table.window_pages() == [2, 3, 4, 5]
    assert alloc.refcount(4) == 1 and alloc.refcount(new) == 1
    with pytest.raises(ValueError, match="not in this page table"):
        twin.replace_page(4, new)
    table.free()
    twin.free()
    assert alloc.num_free() == 16


def test_bad_chunk_changes_nothing():
    alloc = PageAllocator(6)
    table = _table(alloc)
    with pytest.raises(ValueError, match="2 pages"):
        table.append_chunk(alloc.allocate(3))
    with pytest.raises(ValueError, match="free"):
        table.append_chunk([4, 5])  # never allocated
    assert table.num_chunks == 0 and table.all_pages() == []
    with pytest.raises(ValueError):
        PageTable(alloc, pages_per_chunk=1, window_chunks=3, sink=False, max_chunks=2)


class PagedCacheMachine(RuleBasedStateMachine):
    """Random open/append/fork/rewind/replace/free sequences over one pool.

    Independent checks: each page's refcount equals the number of live tables listing it; the
    pool is conserved; a rewind restores exactly the attended pages recorded at that point of
    the table's own history (inherited through forks).
    """

    NUM_PAGES = 40

    def __init__(self):
        super().__init__()
        self.alloc = PageAllocator(self.NUM_PAGES)
        self.tables: list[PageTable] = []
        self.history: list[dict[int, list[int]]] = []  # per table: num_chunks -> attended

    @rule(sink=st.booleans(), window=st.integers(1, 3), extra=st.integers(0, 3))
    def open(self, sink, window, extra):
        if len(self.tables) < 6:
            table = PageTable(self.alloc, pages_per_chunk=2, window_chunks=window, sink=sink,
                              max_chunks=window + extra)
            self.tables.append(table)
            self.history.append({0: []})

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 5))
    def append(self, i):
        i %= len(self.tables)
        pages = self.alloc.allocate(2)
        if pages is None:
            assert self.alloc.num_free() < 2
            return
        table = self.tables[i]
        table.append_chunk(pages)
        self.history[i][table.num_chunks] = table.attended_pages()

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 5))
    def fork(self, i):
        i %= len(self.tables)
        if len(self.tables) < 6:
            twin = self.tables[i].fork()
            assert twin.attended_pages() == self.tables[i].attended_pages()
            assert twin.older_pages() == self.tables[i].older_pages()
            self.tables.append(twin)
            self.history.append(dict(self.history[i]))

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 5), n=st.integers(0, 5))
    def rewind(self, i, n):
        i %= len(self.tables)
        table = self.tables[i]
        before = (table.num_chunks, table.all_pages())
        if n > table.max_rewind():
            with pytest.raises(ValueError):
                table.rewind(n)
            assert (table.num_chunks, table.all_pages()) == before
            return
        table.rewind(n)
        assert table.num_chunks == before[0] - n
        assert table.attended_pages() == self.history[i][table.num_chunks]

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 5), j=st.integers(0, 40))
    def replace(self, i, j):
        i %= len(self.tables)
        table = self.tables[i]
        pages = table.all_pages()
        if not pages or not self.alloc.can_allocate(1):
            return
        old = pages[j % len(pages)]
        (new,) = self.alloc.allocate(1)
        table.replace_page(old, new)
        # the recorded history of this lineage now names the new page in place of the old one
        self.history[i] = {k: [new if p == old else p for p in v]
                           for k, v in self.history[i].items()}

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 5))
    def close(self, i):
        i %= len(self.tables)
        self.tables.pop(i).free()
        self.history.pop(i)

    @invariant()
    def refcounts_match_holders(self):
        held: dict[int, int] = {}
        for table in self.tables:
            for page in table.all_pages():
                held[page] = held.get(page, 0) + 1
        for page in range(self.NUM_PAGES):
            assert self.alloc.refcount(page) == held.get(page, 0) >= 0
        assert self.alloc.num_free() + len(held) == self.NUM_PAGES

    @invariant()
    def views_are_consistent(self):
        for table in self.tables:
            window, older = table.window_pages(), table.older_pages()
            assert table.attended_pages() == table.sink_pages() + window
            assert table.all_pages() == table.sink_pages() + older + window
            assert len(window) <= 2 * table.window_chunks
            assert len(older) + len(window) <= 2 * table.max_chunks

    def teardown(self):
        for table in self.tables:
            table.free()
        assert self.alloc.num_free() == self.NUM_PAGES  # no page leaked


TestPagedCache = pytest.mark.slow(PagedCacheMachine.TestCase)
TestPagedCache.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

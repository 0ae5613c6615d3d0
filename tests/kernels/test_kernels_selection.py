"""Page selection: static sink + window + stride, and dynamic top-k by mean query . mean key."""

import pytest
import torch

from worldstream.kernels import select_pages_static, select_pages_topk, static_page_list


def _lists(ptr, idx):
    return [idx[int(ptr[r]) : int(ptr[r + 1])].tolist() for r in range(len(ptr) - 1)]


def test_static_list_hand_worked():
    table = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    # sink: positions 0-1, window: positions 7-9, stride 3 over older: positions 3, 6
    assert static_page_list(table, sink_pages=2, window_pages=3, stride=3) == [
        10,
        11,
        13,
        16,
        17,
        18,
        19,
    ]
    assert static_page_list(table, sink_pages=1, window_pages=2, stride=0) == [10, 18, 19]
    assert static_page_list([5, 6], sink_pages=1, window_pages=4, stride=2) == [5, 6]


def test_static_stride_keeps_a_page_once_kept():
    table = list(range(100, 140))
    before = set(static_page_list(table[:30], sink_pages=1, window_pages=4, stride=5))
    after = set(static_page_list(table, sink_pages=1, window_pages=4, stride=5))
    strided_before = {p for p in before if (p - 100) % 5 == 0}
    assert strided_before <= after


def test_select_pages_static_csr_repeats_per_query_block():
    ptr, idx = select_pages_static(
        [[0, 1, 2, 3], [7]], sink_pages=1, window_pages=1, stride=0, n_q_blocks=2
    )
    assert ptr.dtype == torch.int32 and idx.dtype == torch.int32
    assert _lists(ptr, idx) == [[0, 3], [0, 3], [7], [7]]
    with pytest.raises(ValueError, match="must all be >= 0"):
        static_page_list([1], sink_pages=-1, window_pages=0, stride=0)


def test_topk_picks_pages_whose_mean_key_aligns_with_mean_query():
    # one head, D=2; query block 0 points along +x, block 1 along +y.
    q = torch.zeros(1, 1, 4, 2)
    q[0, 0, :2] = torch.tensor([1.0, 0.0])
    q[0, 0, 2:] = torch.tensor([0.0, 1.0])
    k_pool = torch.zeros(6, 1, 2, 2)
    k_pool[1] = torch.tensor([3.0, 0.0])  # strongly +x
    k_pool[2] = torch.tensor([0.0, 3.0])  # strongly +y
    k_pool[3] = torch.tensor([1.0, 1.0])  # a bit of both
    k_pool[4] = torch.tensor([-2.0, -2.0])  # away from both
    ptr, idx = select_pages_topk(
        q, k_pool, always=[[0, 5]], candidates=[[1, 2, 3, 4, 5]], k=2, q_block_size=2
    )
    # page 5 is in 'always' so it is not a candidate; block 0 keeps {1, 3}, block 1 keeps {2, 3}
    assert _lists(ptr, idx) == [[0, 5, 1, 3], [0, 5, 2, 3]]


def test_topk_mean_key_uses_valid_tokens_only():
    q = torch.ones(1, 1, 2, 1)
    k_pool = torch.tensor([[[[1.0], [-100.0]]], [[[0.5], [0.5]]]])  # [P=2, H=1, ps=2, D=1]
    always, cand = [[]], [[0, 1]]
    full = _lists(*select_pages_topk(q, k_pool, always, cand, k=1, q_block_size=2))
    part = _lists(
        *select_pages_topk(
            q, k_pool, always, cand, k=1, q_block_size=2, page_lens=torch.tensor([1, 2])
        )
    )
    assert full == [[1]]  # mean of page 0 is -49.5
    assert part == [[0]]  # only its first token (1.0) counts


def test_topk_matches_brute_force_per_batch_row():
    torch.manual_seed(3)
    q, k_pool = torch.randn(2, 3, 8, 4), torch.randn(9, 3, 4, 4)
    always, cand = [[0], [8]], [[1, 2, 3, 4, 5], [6, 7, 2]]
    lists = _lists(*select_pages_topk(q, k_pool, always, cand, k=2, q_block_size=4))
    for b in range(2):
        for j in range(2):
            q_mean = q[b, :, 4 * j : 4 * j + 4].mean(1)  # [H, D]
            scores = {p: float((q_mean * k_pool[p].mean(1)).sum()) for p in cand[b]}
            best = sorted(cand[b], key=scores.get, reverse=True)[:2]
            assert lists[b * 2 + j][:1] == always[b]
            assert sorted(lists[b * 2 + j][1:]) == sorted(best)


def test_topk_fewer_candidates_than_k_and_errors():
    q, k_pool = torch.randn(1, 1, 4, 2), torch.randn(3, 1, 4, 2)
    assert _lists(*select_pages_topk(q, k_pool, [[0]], [[1]], k=5, q_block_size=4)) == [[0, 1]]
    with pytest.raises(ValueError, match=r"candidates\[0\] holds page 3, outside \[0, 3\)"):
        select_pages_topk(q, k_pool, [[0]], [[3]], k=1, q_block_size=4)
    with pytest.raises(ValueError, match="need 1 'always'"):
        select_pages_topk(q, k_pool, [[0], [1]], [[1]], k=1, q_block_size=4)
    with pytest.raises(ValueError, match="multiple of q_block_size=3"):
        select_pages_topk(q, k_pool, [[0]], [[1]], k=1, q_block_size=3)

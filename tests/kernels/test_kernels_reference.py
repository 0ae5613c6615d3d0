"""The reference backend against an independent dense masked SDPA and hand-worked cases."""

import math

import pytest
import torch
from hypothesis import given, settings

from tests.fixtures.kernels import dense_masked_sdpa, paged_cases
from worldstream.kernels import lists_to_csr, paged_attention


@settings(max_examples=60, deadline=None)
@given(case=paged_cases())
def test_reference_equals_dense_masked_sdpa(case):
    out = case.run("reference")
    torch.testing.assert_close(out, dense_masked_sdpa(case), atol=1e-5, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(case=paged_cases(head_dims=(32,), dtype=torch.bfloat16))
def test_reference_bf16_close_to_fp32_oracle(case):
    out = case.run("reference")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dense_masked_sdpa(case), atol=2e-2, rtol=2e-2)


def test_single_valid_key_returns_its_value():
    # page 1 holds one valid token: softmax over one key is 1, so the output is that value row.
    k = torch.randn(3, 2, 4, 8)
    v = torch.randn(3, 2, 4, 8)
    q = torch.randn(1, 2, 4, 8)
    ptr, idx = lists_to_csr([[1]])
    out = paged_attention(q, k, v, ptr, idx, page_lens=torch.tensor([4, 1, 4]), backend="reference")
    expected = v[1, :, 0][None, :, None, :].expand(1, 2, 4, 8)
    torch.testing.assert_close(out, expected)


def test_two_keys_hand_worked_weights():
    # q . k = [2, 0] with scale 1 -> weights e^2/(e^2+1), 1/(e^2+1) over values 1 and 0.
    q = torch.tensor([[[[1.0, 0.0]]]])
    k = torch.tensor([[[[2.0, 0.0], [0.0, 5.0]]]])
    v = torch.tensor([[[[1.0, 1.0], [0.0, 0.0]]]])
    ptr, idx = lists_to_csr([[0]])
    out = paged_attention(q, k, v, ptr, idx, scale=1.0, q_block_size=1, backend="reference")
    w = math.exp(2) / (math.exp(2) + 1)
    torch.testing.assert_close(out, torch.tensor([[[[w, w]]]]))


def test_empty_list_gives_zeros_and_order_does_not_matter():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 32, 16), torch.randn(5, 2, 16, 16), torch.randn(5, 2, 16, 16)
    out_a = paged_attention(q, k, v, *lists_to_csr([[], [4, 0, 2]]), backend="reference")
    out_b = paged_attention(q, k, v, *lists_to_csr([[], [2, 4, 0]]), backend="reference")
    assert torch.equal(out_a[:, :, :16], torch.zeros(1, 2, 16, 16))
    torch.testing.assert_close(out_a, out_b, atol=1e-6, rtol=1e-6)
    assert out_a[:, :, 16:].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_shape_and_dtype(dtype):
    q, k = torch.randn(2, 6, 128, 32, dtype=dtype), torch.randn(4, 6, 64, 32, dtype=dtype)
    out = paged_attention(q, k, k, *lists_to_csr([[0, 1]] * 4), backend="reference")
    assert out.shape == q.shape and out.dtype == dtype

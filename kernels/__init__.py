"""Attention over paged, block-sparse KV: one API, three backends (reference, flex, triton).

See ``kernels/README.md`` for measured speeds and ``paged_attention`` for the contract.
"""

from worldstream.kernels.dispatch import (
    ENV_VAR,
    PagedAttentionPlan,
    available_backends,
    paged_attention,
    plan_paged_attention,
    resolve_backend,
)
from worldstream.kernels.page_lists import lists_to_csr
from worldstream.kernels.selection import select_pages_static, select_pages_topk, static_page_list

__all__ = [
    "ENV_VAR",
    "PagedAttentionPlan",
    "available_backends",
    "lists_to_csr",
    "paged_attention",
    "plan_paged_attention",
    "resolve_backend",
    "select_pages_static",
    "select_pages_topk",
    "static_page_list",
]

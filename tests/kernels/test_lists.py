"""The lists contract (kernels/lists.py): what derived lists carry, dense lists' density, and
keys of other blocks than the lists' refused before any kernel runs."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.kernels import (
    block_sparse_attention,
    block_sparse_attention_reference,
    decode_cache,
    dense_lists,
)
from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.testing import patterned_block_index, random_qkv


@pytest.mark.parametrize("lq,lk,b", [(100, 100, 16), (1, 333, 16), (37, 80, 32), (16, 16, 16)])
def test_dense_lists_keep_every_candidate(lq, lk, b):
    lists = dense_lists(2, 3, lq, lk, b)
    assert lists.key_blocks == -(-lk // b) and lists.block_size == b
    assert lists.density == 1.0
    assert int(lists.kept) == int(lists.count.sum())


def _lists(lk: int = 100, b: int = 16) -> BlockLists:
    idx, cnt = patterned_block_index(1, 2, lk, lk, b, torch.Generator().manual_seed(0))
    return BlockLists(idx, cnt, b, key_blocks=-(-lk // b), kept=torch.tensor(30), candidates=60)


def test_density_is_kept_over_candidates_and_needs_counts():
    assert _lists().density == 0.5
    with pytest.raises(ValueError, match="no pair counts"):
        _ = BlockLists(_lists().index, _lists().count, 16).density


def test_derived_lists_carry_the_keys_and_say_what_their_counts_are():
    lists = _lists()
    start = lists.starting_at(torch.tensor([3]))
    assert start.index is lists.index  # a decode keeper tells selections apart by it
    assert (start.key_blocks, start.kept, start.candidates) == (7, lists.kept, 60)
    tiles = lists.tiled(4, 7)
    assert tiles.query_block == 64 and tiles.key_blocks == 7
    assert tiles.density == lists.density  # the selection's pairs, not the unions'
    part = lists.rows(2, 5)
    assert part.key_blocks == 7 and part.index.shape[2] == 3
    assert part.kept is None and part.candidates is None  # not the part's: dropped


@pytest.mark.parametrize("backend", ["reference", "cpu", None])
def test_keys_of_other_blocks_than_the_lists_are_refused(backend):
    gen = torch.Generator().manual_seed(1)
    q, k, v = random_qkv(1, 4, 2, 100, 120, 16, torch.float32, gen)
    lists = _lists()  # 7 key blocks: 97..112 keys
    for lk in (96, 113, 120):
        with pytest.raises(ValueError, match="7 key blocks of 16 tokens run on"):
            block_sparse_attention(q[:, :, :lk], k[:, :, :lk], v[:, :, :lk], lists, backend=backend)
    for lk in (100, 112):  # any length that ends in the lists' last block
        out = block_sparse_attention(
            q[:, :, -1:], k[:, :, :lk], v[:, :, :lk], lists.rows(6, 7), backend=backend
        )
        assert out.shape == (1, 4, 1, 16)
    unchecked = BlockLists(lists.index, lists.count, 16)  # built by hand: no key length
    block_sparse_attention(q, k[:, :, :100], v[:, :, :100], unchecked, backend=backend)


def test_the_reference_and_the_decode_keeper_refuse_them_too():
    gen = torch.Generator().manual_seed(2)
    q, k, v = random_qkv(1, 4, 2, 1, 130, 16, torch.float32, gen)
    lists = _lists().rows(6, 7)
    with pytest.raises(ValueError, match="key blocks"):
        block_sparse_attention_reference(q, k, v, lists)
    with pytest.raises(ValueError, match="key blocks"):
        decode_cache.KEEPER.plan(None, q, k, v, lists, None, 2)

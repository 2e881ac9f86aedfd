"""A kept-block mask as index lists in C (kernels/block_lists.py) against its torch reference."""

import pytest
import torch

from sketchwalk.kernels.block_lists import block_lists, block_lists_reference


@pytest.mark.parametrize("seed", range(10))
def test_c_equals_the_reference_on_random_masks(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = [(1, 3, 5, 7), (2, 1, 40, 40), (1, 2, 1, 1), (3, 2, 9, 130)][seed % 4]
    keep = torch.rand(*shape, generator=gen) < [0.0, 0.05, 0.3, 0.9, 1.0][seed % 5]
    if seed % 3 == 0:
        keep = keep.transpose(-1, -2).contiguous().transpose(-1, -2)  # not row-major
    most = int(keep.sum(-1).max()) if keep.numel() else 0
    for kmax in (max(most, 1), most + 3):
        got, want = block_lists(keep, kmax), block_lists_reference(keep, kmax)
        assert got.dtype == want.dtype == torch.int32 and got.shape == (*shape[:-1], kmax)
        assert torch.equal(got, want)


def test_lists_are_the_kept_blocks_then_the_first_repeated():
    keep = torch.tensor([[False, True, False, True], [False] * 4, [True] + [False] * 3])
    for fn in (block_lists, block_lists_reference):
        assert fn(keep, 3).tolist() == [[1, 3, 1], [3, 3, 3], [0, 0, 0]]

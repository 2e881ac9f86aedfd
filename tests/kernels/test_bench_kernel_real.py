"""kernel_real's --baseline: a copy of kernels/cpu.py loaded beside the package's kernel."""

import shutil
from pathlib import Path

import torch

import sketchwalk.kernels.cpu as cpu
from sketchwalk.benchmarks.kernel_real import _load_kernel
from sketchwalk.kernels.lists import BlockLists


def test_a_baseline_copy_of_the_kernel_loads_and_computes_the_same(tmp_path: Path):
    """The copy's relative imports resolve inside the package, and it gives the same output."""
    copy = tmp_path / "cpu_base.py"
    shutil.copy(cpu.__file__, copy)
    baseline = _load_kernel(copy)
    assert baseline is not cpu.block_sparse_attention_cpu
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 64, 16), torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)
    n = 64 // 16
    index = torch.arange(n).repeat(1, 2, n, 1).to(torch.int32)
    count = (torch.arange(n) + 1).repeat(1, 2, 1).to(torch.int32)
    want = cpu.block_sparse_attention_cpu(q, k, v, BlockLists(index, count, 16))
    assert torch.equal(baseline(q, k, v, BlockLists(index, count, 16)), want)

"""Triton kernels through the CPU interpreter.

TRITON_INTERPRET=1 must be set before triton is imported, and setting it in the main test process
would route every other CPU test through the (slow) interpreter. So these tests are collected only
when the variable is already set: tests/kernels/test_triton_interpreter.py runs them in a subprocess
(`TRITON_INTERPRET=1 pytest tests/kernels/interp` also works by hand).
"""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET") != "1":
    collect_ignore_glob = ["test_*.py"]


def pytest_configure(config):
    """Memory nothing wrote reads as NaN here, every time (torch fills torch.empty and friends
    only in deterministic mode): a kernel, launcher or harness reading what it never wrote fails
    at once instead of once in a few runs, as on a GPU whose allocator hands back anything."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return  # not collected (above): leave the main test process as it is
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    config.addinivalue_line("filterwarnings", "ignore:.*does not have a deterministic")

"""Runs tests/kernels/interp (the Triton kernels) in a subprocess with TRITON_INTERPRET=1.

The variable has to be set before triton is imported, and must not leak into this process (every
CPU attention call would then take the interpreter). See interp/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.interp
def test_triton_kernels_in_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        # This session already collects interp/ directly; check that it really interprets.
        from triton.runtime.interpreter import InterpretedFunction

        from sketchwalk.kernels.triton_prefill import block_sparse_prefill_kernel

        assert isinstance(block_sparse_prefill_kernel, InterpretedFunction)
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", str(HERE / "interp"), "-q", "-p", "no:cacheprovider"]
    # about 10 minutes alone on 2 cores (the engine's device path is half of it)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout

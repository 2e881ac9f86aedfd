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


# Three parts, each in its own subprocess under its own limit (each a few minutes alone on 2
# cores, several times that on a loaded machine): the kernels against their references, the
# engine's layers on the device path, and the entry points around them.
PARTS = {
    "kernels": ["test_triton_prefill.py", "test_triton_decode.py", "test_triton_block_mass.py",
                "test_gpu_check_smoke.py"],
    "layers": ["test_engine_device_path.py", "test_c_kernels_decline_device_tensors.py"],
    "entry points": ["test_recorded_device_path.py", "test_gpu_entry_points.py"],
}  # fmt: skip


def test_the_parts_cover_the_folder():
    assert sorted(sum(PARTS.values(), [])) == sorted(
        p.name for p in (HERE / "interp").glob("test_*.py")
    )


@pytest.mark.interp
@pytest.mark.parametrize("part", list(PARTS))
def test_triton_kernels_in_interpreter(part):
    if os.environ.get("TRITON_INTERPRET") == "1":
        # This session already collects interp/ directly; check that it really interprets.
        from triton.runtime.interpreter import InterpretedFunction

        from sketchwalk.kernels.triton_prefill import block_sparse_prefill_kernel

        assert isinstance(block_sparse_prefill_kernel, InterpretedFunction)
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    files = [str(HERE / "interp" / name) for name in PARTS[part]]
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout

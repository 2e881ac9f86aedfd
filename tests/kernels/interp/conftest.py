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

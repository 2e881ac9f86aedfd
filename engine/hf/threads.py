"""One CPU thread for a decode layer's small ops.

Why: with two intra-op threads every op that goes parallel hands work to the other thread, and
where that thread sleeps (passive OpenMP waits, or idle past sketchwalk/openmp.py's short spin)
wakes it first; a decode layer's sketch, walk, select and kept-block attention are dozens of
tiny ops, and a [1, 9, 1, 64] matmul took 122 us with two passive threads against 8 us with one
on the project's CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Run the block with one intra-op thread on CPU (restored after); a no-op elsewhere."""
    n = torch.get_num_threads()
    if device.type != "cpu" or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)

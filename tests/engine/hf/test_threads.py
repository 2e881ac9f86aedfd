"""engine/hf/threads.py: one intra-op thread inside, the caller's count restored after."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.engine.hf.threads import one_thread


def test_one_thread_inside_and_restored_even_on_error():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread(torch.device("cpu")):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), one_thread(torch.device("cpu")):
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
        with one_thread(torch.device("meta")):  # not the CPU: nothing changes
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)

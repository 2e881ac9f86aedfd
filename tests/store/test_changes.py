"""The store's count of this process's committed writes (what New run's waiting poll wakes on)."""

from __future__ import annotations

import threading

import pytest

from sketchwalk.store.core import Changes
from sketchwalk.store.errors import JobLostError


def test_a_committed_write_moves_the_count_and_a_failed_one_does_not(store):
    before = store.changes.count
    job = store.enqueue_job({"prompt": "x"})
    assert store.changes.count == before + 1
    store.get_job(job)  # a read moves nothing
    assert store.changes.count == before + 1
    with pytest.raises(JobLostError):  # fenced on a claim nobody holds: rolled back
        store.create_run({"prompt": "x"}, status="running", job=(job, "not-the-claim"))
    assert store.changes.count == before + 1


def test_wait_returns_when_another_thread_moves_the_count():
    changes = Changes()
    seen = changes.count
    moved = threading.Timer(0.05, changes.bump)
    moved.start()
    assert changes.wait(seen, timeout_s=60.0) == seen + 1  # long before the timeout
    moved.join()


def test_wait_gives_up_after_its_timeout_with_the_count_unmoved():
    changes = Changes()
    assert changes.wait(changes.count, timeout_s=0.01) == 0
    changes.bump()
    assert changes.wait(0, timeout_s=0.0) == 1  # already moved: at once

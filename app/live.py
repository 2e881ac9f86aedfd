"""A polling fragment that answers as soon as what it shows changes, not at its next poll.

New run's jobs panel (and Benchmarks' eval job) reruns every `poll_s` while a job runs, so a
verdict the worker stores just after a poll waits for the next one (half a second on average at 1
s). Polling more often costs the cores the run needs (measured: slower verdicts). Instead the
fragment's rerun waits for the store's write count (`store.core.Changes`, moved by the in-app
worker thread's commits) and returns when the panel's signature differs, or as soon as the page
asks for anything (its next poll, a click: a waiting fragment must never delay a person). A worker
in another process moves no count here, so its page polls as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

from streamlit.runtime.scriptrunner import get_script_run_ctx

from sketchwalk.store.core import Changes

SLICE_S = 0.05
"""How often the wait looks for a request from the page (a click is answered within this)."""


def page_request_pending(requests: Any) -> bool:
    """Whether the page asked for a rerun or stop while this script runs (Streamlit's own script
    requests; an unknown shape counts as pending, so a changed Streamlit only loses the wait)."""
    state = getattr(requests, "_state", None)
    return getattr(state, "name", None) != "CONTINUE"


def wait_for_change(
    changes: Changes,
    signature: Callable[[], Hashable],
    pending: Callable[[], bool],
    cap_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Block until `signature()` differs from its value now (looked at only when `changes`'
    count moved), `pending()` is true, or `cap_s` passed. True when the signature changed."""
    seen = changes.count
    start = signature()
    deadline = clock() + cap_s
    while not pending():
        left = deadline - clock()
        if left <= 0:
            return False
        count = changes.wait(seen, min(SLICE_S, left))
        if count != seen:
            seen = count
            if signature() != start:
                return True
    return False


def wait_in_fragment(changes: Changes, signature: Callable[[], Hashable], cap_s: float) -> bool:
    """`wait_for_change` in a fragment's own rerun (never in a full page run, which a person is
    waiting for); False at once elsewhere or where Streamlit exposes no script requests."""
    ctx = get_script_run_ctx()
    requests = getattr(ctx, "script_requests", None)
    if ctx is None or requests is None or not ctx.fragment_ids_this_run:
        return False
    return wait_for_change(changes, signature, lambda: page_request_pending(requests), cap_s)

"""New run's waiting poll (app/live.py): it answers a change at once, and never holds a request."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from sketchwalk.app.live import page_request_pending, wait_for_change, wait_in_fragment
from sketchwalk.store.core import Changes


class _Clock:
    """A clock that moves only when the waits it counts ask it to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _FakeChanges:
    """Changes whose wait advances a fake clock and runs the writes scheduled for that slice."""

    def __init__(self, clock: _Clock, writes: dict[int, callable]) -> None:
        self.clock, self.writes, self.count, self.slices = clock, writes, 0, 0

    def wait(self, seen: int, timeout_s: float) -> int:
        self.slices += 1
        self.clock.now += timeout_s
        write = self.writes.pop(self.slices, None)
        if write is not None:
            write()
            self.count += 1
        return self.count


def test_returns_when_the_signature_changes_not_on_writes_that_leave_it():
    clock, state = _Clock(), {"status": "running"}
    writes = {3: lambda: None, 7: lambda: state.update(status="done")}  # a heartbeat, then done
    changes = _FakeChanges(clock, writes)
    looked = []

    def signature():
        looked.append(clock.now)
        return state["status"]

    assert wait_for_change(changes, signature, lambda: False, cap_s=10.0, clock=clock)
    assert changes.slices == 7  # woke at the heartbeat, looked, went on waiting
    assert len(looked) == 3  # at the start, after the heartbeat, after the finish


def test_gives_up_at_the_cap_and_at_once_when_the_page_asks():
    clock = _Clock()
    changes = _FakeChanges(clock, {})
    assert not wait_for_change(changes, lambda: 1, lambda: False, cap_s=0.5, clock=clock)
    assert clock.now >= 0.5
    changes2 = _FakeChanges(_Clock(), {1: lambda: None})
    assert not wait_for_change(changes2, lambda: 1, lambda: True, cap_s=10.0, clock=_Clock())
    assert changes2.slices == 0  # a pending request (a click, the next poll): no wait at all

    asked = iter([False, False, True])
    changes3 = _FakeChanges(_Clock(), {})
    assert not wait_for_change(changes3, lambda: 1, lambda: next(asked), cap_s=10.0)
    assert changes3.slices == 2


def test_a_real_write_from_another_thread_ends_the_wait():
    changes, state = Changes(), {"saved": False}

    def save():
        state["saved"] = True
        changes.bump()

    threading.Timer(0.05, save).start()
    assert wait_for_change(changes, lambda: state["saved"], lambda: False, cap_s=60.0)


def test_page_requests_read_from_streamlits_state_names():
    assert not page_request_pending(SimpleNamespace(_state=SimpleNamespace(name="CONTINUE")))
    assert page_request_pending(SimpleNamespace(_state=SimpleNamespace(name="RERUN")))
    assert page_request_pending(SimpleNamespace(_state=SimpleNamespace(name="STOP")))
    assert page_request_pending(object())  # a Streamlit without them: never wait


def test_no_wait_outside_a_fragments_rerun():
    changes = Changes()
    assert not wait_in_fragment(changes, lambda: 1 / 0, cap_s=60.0)  # bare: not even a look


def test_streamlit_still_names_its_script_requests_as_the_wait_reads_them():
    from streamlit.runtime.scriptrunner_utils.script_requests import (
        ScriptRequests,
        ScriptRequestType,
    )
    from streamlit.runtime.scriptrunner_utils.script_run_context import ScriptRunContext

    requests = ScriptRequests()
    assert not page_request_pending(requests)
    requests.request_stop()
    assert page_request_pending(requests)
    assert ScriptRequestType.CONTINUE.name == "CONTINUE"
    assert "script_requests" in ScriptRunContext.__dataclass_fields__

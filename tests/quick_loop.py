"""The quick loop's selection: `make check` leaves out tests whose recorded time is above a
budget, so everyday runs take about a minute; `make test` runs every test.

Times live in tests/durations.json (node id -> seconds), written by `make durations`
(`--record-durations`). A test with no recorded time (a new one) runs; every test module keeps
its fastest test, so each module is still touched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quick loop")
    group.addoption(
        "--quick",
        type=float,
        default=None,
        metavar="SECONDS",
        help="leave out tests recorded (tests/durations.json) as taking more than SECONDS",
    )
    group.addoption(
        "--record-durations",
        action="store_true",
        help="write each test's call time into tests/durations.json",
    )


def quick_selection(items: list, durations: dict[str, float], budget: float) -> tuple[list, list]:
    """(kept, left out): tests above the budget go, except each module's fastest."""
    fastest: dict[str, object] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        best = fastest.get(module)
        if best is None or durations.get(item.nodeid, 0.0) < durations.get(best.nodeid, 0.0):
            fastest[module] = item
    keep_anyway = {id(item) for item in fastest.values()}
    kept, left = [], []
    for item in items:
        slow = durations.get(item.nodeid, 0.0) > budget
        (left if slow and id(item) not in keep_anyway else kept).append(item)
    return kept, left


@pytest.hookimpl(trylast=True)  # after the -m selection, so a module's fastest is one that runs
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    budget = config.getoption("quick")
    if budget is None or not DURATIONS.exists():
        return
    kept, left = quick_selection(items, json.loads(DURATIONS.read_text()), budget)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


_recorded: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _recorded[report.nodeid] = round(report.duration, 3)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("record_durations") or not _recorded:
        return
    old = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    old.update(_recorded)
    DURATIONS.write_text(json.dumps(dict(sorted(old.items())), indent=0) + "\n")

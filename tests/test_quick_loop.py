"""The quick loop's selection (tests/quick_loop.py): slow tests go, new ones stay, every module
keeps its fastest test."""

from types import SimpleNamespace

from quick_loop import quick_selection


def _items(*ids):
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_slow_tests_go_and_each_module_keeps_its_fastest():
    items = _items("a.py::fast", "a.py::slow", "b.py::slow1", "b.py::slow2", "c.py::new")
    durations = {"a.py::fast": 0.01, "a.py::slow": 3.0, "b.py::slow1": 2.0, "b.py::slow2": 1.0}
    kept, left = quick_selection(items, durations, budget=0.2)
    assert [i.nodeid for i in kept] == ["a.py::fast", "b.py::slow2", "c.py::new"]
    assert [i.nodeid for i in left] == ["a.py::slow", "b.py::slow1"]


def test_a_budget_above_every_time_keeps_everything():
    items = _items("a.py::x", "a.py::y")
    kept, left = quick_selection(items, {"a.py::x": 1.0, "a.py::y": 2.0}, budget=5.0)
    assert kept == items and left == []

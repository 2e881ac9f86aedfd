"""A bounded, process-wide LRU of built layer views (figures.LayerData), for Explore's slider.

Why not st.cache_data: it pickles what it stores and unpickles a copy on every hit, so a
revisit still paid for copying the arrays; and its entry bound is per function, with no say
in what an entry weighs. Here a hit hands back the stored object itself (LayerData is frozen and
the page only reads it), so a revisited layer costs the figure drawing alone.

Why 32 entries: an entry at 128k tokens (2048 blocks, tiles of 8) is three 256 x 256 max and
mean float32 pairs plus the kept share, about 1.8 MB; 32 entries stay under 60 MB per process
whatever the context length (a view never exceeds 256 x 256 cells), and hold every layer of a
32-layer model at one phase and zoom, so sweeping the slider back and forth stays warm.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

V = TypeVar("V")

MAX_ENTRIES = 32


class ViewKey(NamedTuple):
    """Everything a layer view depends on: where the data lives and which part is shown.

    `phase` is the stored phase, group included ("prefill:g1"); `zoom` the region (q_lo, q_hi,
    k_lo, k_hi) or None for the whole layer.
    """

    store: str
    run_id: str
    phase: str
    step: int
    layer: int
    zoom: tuple[int, int, int, int] | None


class LRU(Generic[V]):
    """At most `max_entries` values, the least recently used dropped first; thread-safe (the
    app serves every browser session from threads of one process)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._items: OrderedDict[ViewKey, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: ViewKey) -> bool:
        return key in self._items

    def get(self, key: ViewKey, build: Callable[[], V]) -> V:
        """The value for key, built (outside the lock: builds of other keys go on) on a miss."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

"""A small, self-contained module used as a code prompt: an LRU cache and a text statistics helper.

It exists so the explorer has real-looking Python to look at: definitions far apart that refer to
each other, which is where long-range attention (and block selection) matters.
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


class LRUCache(Generic[K, V]):
    """A least-recently-used cache with a fixed capacity and hit/miss counters."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: K, default: V | None = None) -> V | None:
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key]
        self.misses += 1
        return default

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get_or_compute(self, key: K, compute: Callable[[K], V]) -> V:
        found = self.get(key)
        if found is not None:
            return found
        value = compute(key)
        self.put(key, value)
        return value

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


@dataclass
class TextStats:
    """Word counts of a document, with the helpers a search index would need."""

    counts: Counter[str] = field(default_factory=Counter)
    documents: int = 0

    def add(self, text: str) -> None:
        self.counts.update(w.lower() for w in WORD.findall(text))
        self.documents += 1

    def add_all(self, texts: Iterable[str]) -> TextStats:
        for text in texts:
            self.add(text)
        return self

    def top(self, k: int = 10) -> list[tuple[str, int]]:
        return self.counts.most_common(k)

    def frequency(self, word: str) -> float:
        total = sum(self.counts.values())
        return self.counts[word.lower()] / total if total else 0.0


def tokenize(text: str) -> list[str]:
    """Lower-cased words; apostrophes and hyphens stay inside words."""
    return [w.lower() for w in WORD.findall(text)]


def ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    if n < 1:
        raise ValueError("n must be at least 1")
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def similarity(a: str, b: str, n: int = 2) -> float:
    """Jaccard similarity of the word n-grams of two texts (0 = disjoint, 1 = same)."""
    ga, gb = set(ngrams(tokenize(a), n)), set(ngrams(tokenize(b), n))
    if not ga and not gb:
        return 1.0
    return len(ga & gb) / len(ga | gb)


def cached_similarity(cache: LRUCache[tuple[str, str], float], a: str, b: str) -> float:
    """Similarity with memoisation; the cache key is order-independent."""
    key = (a, b) if a <= b else (b, a)
    return cache.get_or_compute(key, lambda k: similarity(k[0], k[1]))


def most_similar(query: str, corpus: list[str], k: int = 3) -> list[tuple[float, str]]:
    """The k texts of the corpus closest to the query, best first."""
    cache: LRUCache[tuple[str, str], float] = LRUCache(capacity=max(16, 2 * len(corpus)))
    scored = [(cached_similarity(cache, query, doc), doc) for doc in corpus]
    scored.sort(key=lambda pair: pair[0], reverse=True)
    return scored[:k]


if __name__ == "__main__":
    docs = [
        "The quick brown fox jumps over the lazy dog.",
        "A quick brown dog outpaces a lazy fox.",
        "Attention is all you need, but sparse attention is cheaper.",
    ]
    stats = TextStats().add_all(docs)
    print(stats.top(5))
    print(most_similar("the lazy brown fox", docs, k=2))

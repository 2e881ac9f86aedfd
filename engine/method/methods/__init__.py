"""The method registry: one small module per way of scoring blocks.

A method declares what it needs (the exact block mass, the raw queries and keys), what it
supports (decode, queries after a cache) and how it scores blocks. The pipeline, the config's
validation, the command line and the app's density preview all ask this registry, so a new
method is one module here plus its test.
"""

from __future__ import annotations

from sketchwalk.engine.method.methods.base import Method, ScoreInputs
from sketchwalk.engine.method.methods.dense import METHOD as DENSE
from sketchwalk.engine.method.methods.nowalk import METHOD as NOWALK
from sketchwalk.engine.method.methods.oracle import METHOD as ORACLE
from sketchwalk.engine.method.methods.quest import METHOD as QUEST
from sketchwalk.engine.method.methods.sketchwalk import METHOD as SKETCHWALK
from sketchwalk.engine.method.methods.streaming import METHOD as STREAMING
from sketchwalk.engine.method.methods.xattention import METHOD as XATTENTION
from sketchwalk.engine.method.methods.xattention_threshold import METHOD as XATTENTION_THRESHOLD
from sketchwalk.errors import ConfigError

REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (SKETCHWALK, NOWALK, ORACLE, STREAMING, QUEST, XATTENTION, XATTENTION_THRESHOLD, DENSE)
}


def names(sparse_only: bool = False) -> tuple[str, ...]:
    """Registered method names (sparse_only: without the dense reference)."""
    return tuple(n for n, m in REGISTRY.items() if not (sparse_only and m.score is None))


def get(name: str) -> Method:
    if name not in REGISTRY:
        raise ConfigError(f"unknown method {name!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[name]


__all__ = ["Method", "ScoreInputs", "REGISTRY", "get", "names"]

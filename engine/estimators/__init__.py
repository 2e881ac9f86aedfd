"""The estimator registry: one small module per way of estimating a layer's block mass.

An estimator declares what its prefill keeps (sampled queries, every sketched key) and how it
estimates A_l's rows in a prefill or chunk and the current row in decode (estimators/base.py).
The config's `estimator` knob, the pipeline and decode all ask this registry, so a new estimator
is one module here plus its registry line and test.
"""

from __future__ import annotations

from .base import DecodeInputs, Estimator
from .mean import ESTIMATOR as MEAN
from .query import ESTIMATOR as QUERY
from .sampled import ESTIMATOR as SAMPLED

REGISTRY: dict[str, Estimator] = {e.name: e for e in (MEAN, QUERY, SAMPLED)}


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: str) -> Estimator:
    from sketchwalk.engine.config import ConfigError

    if name not in REGISTRY:
        raise ConfigError(f"unknown estimator {name!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[name]


__all__ = ["DecodeInputs", "Estimator", "REGISTRY", "get", "names"]

"""The estimator registry: one small module per way of estimating a layer's block mass.

An estimator declares what its prefill keeps (sampled queries, every sketched key) and how it
estimates A_l's rows in a prefill or chunk and the current row in decode (estimators/base.py).
The config's `estimator` knob, the pipeline and decode all ask this registry, so a new estimator
is one module here plus its registry line and test.
"""

from __future__ import annotations

from sketchwalk.engine.method.estimators.base import DecodeInputs, Estimator
from sketchwalk.engine.method.estimators.mean import ESTIMATOR as MEAN
from sketchwalk.engine.method.estimators.query import ESTIMATOR as QUERY
from sketchwalk.engine.method.estimators.sampled import ESTIMATOR as SAMPLED
from sketchwalk.errors import ConfigError

REGISTRY: dict[str, Estimator] = {e.name: e for e in (MEAN, QUERY, SAMPLED)}


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: str) -> Estimator:
    if name not in REGISTRY:
        raise ConfigError(f"unknown estimator {name!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[name]


__all__ = ["DecodeInputs", "Estimator", "REGISTRY", "get", "names"]

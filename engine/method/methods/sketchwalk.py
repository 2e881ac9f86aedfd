"""Sketch&Walk: Hadamard-sketched block estimates, propagated across layers by the walk."""

from __future__ import annotations

from sketchwalk.engine.method.methods.base import Method, ScoreInputs


def score(x: ScoreInputs):
    return x.w if x.w is not None else x.a


METHOD = Method(
    name="sketchwalk",
    help="Sketch&Walk: walk scores W_l over sketched block estimates",
    score=score,
    walks=True,
    chunks=True,
    preview=lambda rec: rec.get("walk"),
)

"""The oracle: the exact row-normalised block attention mass. It costs a dense softmax, so it is
an upper bound for estimators at the same granularity, not a deployable method."""

from __future__ import annotations

from sketchwalk.engine.method.methods.base import Method, ScoreInputs


def score(x: ScoreInputs):
    if x.exact is None:
        raise ValueError("the oracle needs the exact block mass; the caller passed none")
    return x.exact


METHOD = Method(
    name="oracle",
    help="exact block attention mass (a dense softmax: the upper bound)",
    score=score,
    needs_exact=True,
    preview=lambda rec: rec.get("exact"),
    reads_sketch=False,
)

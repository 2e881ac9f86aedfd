"""The per-layer baseline: the sketch's block estimate A_l alone (Sketch&Walk with beta = 0),
which is what MInference-style block selection does."""

from __future__ import annotations

from sketchwalk.engine.method.methods.base import Method, ScoreInputs


def score(x: ScoreInputs):
    return x.a


METHOD = Method(
    name="nowalk",
    help="the sketch's per-layer block estimate A_l, no walk (ablation)",
    score=score,
    chunks=True,
    preview=lambda rec: rec.get("sketch"),
)

"""StreamingLLM (Xiao et al. 2023): sink blocks plus the most recent blocks. Scores are the
negative distance to the query block, so they compare across rows (a layer budget gives every
row about the same recent window)."""

from __future__ import annotations

import numpy as np
import torch

from sketchwalk.engine.method.methods.base import Method, ScoreInputs


def score(x: ScoreInputs) -> torch.Tensor:
    j = torch.arange(x.shape[-1], device=x.device, dtype=torch.float32)
    dist = x.q_blocks.to(x.device, torch.float32)[:, None] - j[None, :]
    return (-dist).expand(x.shape)


def preview(rec: dict) -> np.ndarray:
    n = int(rec["n_blocks"])
    rows = np.asarray(rec.get("q_blocks", np.arange(n)), dtype=np.float32)
    return (np.arange(n, dtype=np.float32)[None, :] - rows[:, None]).astype(np.float32)


METHOD = Method(
    name="streaming",
    help="StreamingLLM: sink and the most recent blocks",
    score=score,
    chunks=True,
    preview=preview,
    reads_sketch=False,
)

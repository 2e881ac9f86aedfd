"""Stored runs whose masks are known, for the needle tracker, the mask diff and the browser test.

Six blocks of four tokens; the needle "KEY-4242" sits in tokens 9-10 (block 2). Layer 0 is dense;
the last row of each later record keeps or drops block 2 and ranks it at a chosen place in the
walk scores; the exact mass on block 2 is 0.5 of the row everywhere.
"""

from __future__ import annotations

import numpy as np

from sketchwalk.engine.run.records import BlockSpan, LayerRecord, RunResult, TokenRecord

B, N = 4, 6  # block size, prompt blocks
WORDS = [f"w{i} " for i in range(N * B)]
WORDS[9], WORDS[10] = "KEY-", "4242 "  # the needle: tokens 9-10, block 2


def _layer(phase, step, layer, n, keep_needle, walk_rank_of_needle, dense=False, extra=()):
    """One record whose last row keeps (or drops) block 2, with block 2 at a known rank."""
    rows = n if phase == "prefill" else 1
    q = np.arange(n) if phase == "prefill" else np.array([n - 1])
    walk = np.tile(np.linspace(1.0, 0.1, n, dtype=np.float32), (rows, 1))
    order = [j for j in range(n) if j != 2]
    order.insert(walk_rank_of_needle - 1, 2)
    walk[-1, order] = np.linspace(1.0, 0.1, n, dtype=np.float32)  # order[0] scores highest
    exact = np.full((rows, n), 0.5 / (n - 1), dtype=np.float32)
    exact[-1, 2] = 0.5
    sel = np.zeros((rows, n), dtype=bool)
    sel[:, 0] = True
    sel[-1, 2] = keep_needle
    sel[-1, list(extra)] = True
    return LayerRecord(
        phase,
        step,
        layer,
        dense,
        n,
        q,
        sketch=walk.copy(),
        walk=None if dense else walk,
        exact=exact,
        selected=None if dense else sel,
    )


def known_result(flip: bool = False, method: str = "sketchwalk") -> RunResult:
    """The run; `flip` drops the needle where the plain run keeps it and keeps block 1 too."""
    extra = (1,) if flip else ()
    layers = [
        _layer("prefill", 0, 0, N, True, 1, dense=True),
        _layer("prefill", 0, 1, N, not flip, 2, extra=extra),
        _layer("prefill", 0, 2, N, flip, 5, extra=extra),
        _layer("decode", 1, 1, N, False, 4),
        _layer("decode", 1, 2, N, True, 1),
    ]
    tokens = [
        TokenRecord(v, p, p, WORDS[p], None if p == 0 else -1.0)
        for v in ("dense", "sparse")
        for p in range(N * B)
    ]
    return RunResult(
        "tiny",
        None,
        "".join(WORDS),
        N * B,
        method,
        {"block_size": B, "method": method, "density": 0.3 if flip else 0.2},
        "cpu",
        {},
        "",
        "",
        {"kl_mean": 0.02 if flip else 0.01},
        {},
        layers,
        [BlockSpan(b, b * B, (b + 1) * B, "") for b in range(N)],
        tokens,
    )


def save_known(store, flip: bool = False, method: str = "sketchwalk") -> str:
    """Create a run in `store`, save the known result into it, return its id."""
    res = known_result(flip, method)
    run_id = store.create_run({"prompt": res.prompt, "config": res.config}, status="running")
    store.save_result(run_id, res)
    return run_id

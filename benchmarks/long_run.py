"""Write a realistic long run to a store through the store's own API (no model needed).

The explorer has to stay interactive at 32k-128k tokens; this makes such a run in seconds so the
rendering can be measured (benchmarks/render_long.py) and looked at. Matrices have the shapes
and structure of a real Sketch&Walk run: attention mass concentrated on sink blocks, a local
window and a few far "needle" blocks per row; walk scores a smoothed copy of it; a kept mask
at the target density (sink + window forced, then the top walk scores); exact mass where the
context is under the recorder's limit, as the engine does. Prints the run id.

    .venv/bin/python -m sketchwalk.benchmarks.long_run --tokens 131072 --db /tmp/long.duckdb
"""

from __future__ import annotations

import argparse

import numpy as np

from sketchwalk.engine.run.records import BlockSpan, LayerRecord, RunResult, TokenRecord

WORDS = ("the", "river", "flows", "past", "old", "mill", "towards", "sea", "and", "hills")


def _rows(n: int, rng: np.random.Generator, far: np.ndarray) -> np.ndarray:
    """[n, n] causal rows that sum to one: sink, local decay, a few far blocks, noise."""
    i = np.arange(n)
    dist = (i[:, None] - i[None, :]).astype(np.float32)
    z = np.exp(-np.maximum(dist, 0) / 4.0) + 0.3 * (i[None, :] < 2)
    z += 0.5 * np.isin(i, far)[None, :]
    z += rng.random((n, n), dtype=np.float32) * 0.02
    z = np.where(dist >= 0, z, 0).astype(np.float32)
    return z / z.sum(1, keepdims=True)


def _kept(scores: np.ndarray, density: float) -> np.ndarray:
    """Sink and window forced, then the highest scores up to `density` of each causal row."""
    n = scores.shape[0]
    i = np.arange(n)
    causal = i[None, :] <= i[:, None]
    budget = np.maximum(1, np.ceil(density * (i + 1))).astype(int)
    order = np.argsort(-np.where(causal, scores, -np.inf), axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, i[None, :].repeat(n, 0), axis=1)
    forced = (i[None, :] < 1) | ((i[:, None] - i[None, :]) < 2)
    return causal & ((rank < budget[:, None]) | forced)


def _last_kept(scores: np.ndarray, density: float) -> np.ndarray:
    """The decode row's kept blocks: sink, the last two blocks, then the top scores."""
    n = scores.size
    keep = np.zeros(n, dtype=bool)
    keep[np.argsort(-scores)[: max(1, int(np.ceil(density * n)))]] = True
    keep[0] = True
    keep[-2:] = True
    return keep


def _layer_records(
    layer: int,
    n: int,
    rng: np.random.Generator,
    far: np.ndarray,
    density: float,
    decode: int,
    exact_ok: bool,
) -> list[LayerRecord]:
    """One layer's prefill record and its decode steps' records (drawing from rng in order)."""
    recs: list[LayerRecord] = []
    exact = _rows(n, rng, far)
    sketch = (exact + rng.random((n, n), dtype=np.float32) * 1e-3) * np.tri(n, dtype=np.float32)
    walk = sketch + 0.5 * sketch.mean(0, keepdims=True) * np.tri(n, dtype=np.float32)
    dense = layer == 0
    kept = None if dense else _kept(walk, density)
    nan = np.tri(n, dtype=bool)
    recs.append(
        LayerRecord(
            "prefill",
            0,
            layer,
            dense,
            n,
            np.arange(n),
            sketch=np.where(nan, sketch, np.nan).astype(np.float32),
            walk=None if dense else np.where(nan, walk, np.nan).astype(np.float32),
            exact=np.where(nan, exact, np.nan).astype(np.float32) if exact_ok else None,
            selected=kept,
            density_target=None if dense else density,
            density_achieved=None if dense else float(kept.sum() / nan.sum()),
            mass_recall=None if dense or not exact_ok else float((exact * kept).sum(1).mean()),
        )
    )
    for step in range(1, decode + 1):
        row = _rows(n, rng, far)[-1:]
        recs.append(
            LayerRecord(
                "decode",
                step,
                layer,
                dense,
                n,
                np.array([n - 1]),
                sketch=row,
                walk=None if dense else row * 1.1,
                exact=row if exact_ok else None,
                selected=None if dense else _last_kept(row[0], density)[None],
            )
        )
    return recs


def make_long_result(
    tokens: int,
    layers: int = 4,
    block: int = 64,
    density: float = 0.1,
    decode: int = 4,
    seed: int = 0,
) -> RunResult:
    rng = np.random.default_rng(seed)
    n = -(-tokens // block)
    far = rng.choice(np.arange(2, max(n - 8, 3)), size=min(6, max(n - 10, 1)), replace=False)
    exact_ok = tokens <= 8192
    recs: list[LayerRecord] = []
    for layer in range(layers):
        recs += _layer_records(layer, n, rng, far, density, decode, exact_ok)
    words = [WORDS[k % len(WORDS)] + " " for k in range(tokens)]
    for f in far[:1]:
        words[f * block + 3] = "PASSKEY-31337 "
    toks = [
        TokenRecord(v, p, 0, words[p], None if p == 0 else -1.0, None if v == "dense" else 0.01)
        for v in ("dense", "sparse")
        for p in range(tokens)
    ]
    spans = [
        BlockSpan(
            b,
            b * block,
            min(tokens, (b + 1) * block),
            "".join(words[b * block : (b + 1) * block])[:240],
        )
        for b in range(n)
    ]
    return RunResult(
        "generated/long-run",
        None,
        "".join(words),
        tokens,
        "sketchwalk",
        {"block_size": block, "density": density, "method": "sketchwalk"},
        "cpu",
        {},
        "",
        "",
        {"kl_mean": 0.01},
        {},
        recs,
        spans,
        toks,
    )


def main() -> None:
    from sketchwalk.store import open_store

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--db", default=None, help="store URL or DuckDB file (default: $SKETCHWALK_DB)")
    args = p.parse_args()
    res = make_long_result(args.tokens, args.layers)
    with open_store(args.db) as store:
        run_id = store.create_run({"prompt": res.prompt, "config": res.config}, status="running")
        store.save_result(run_id, res)
    print(run_id)


if __name__ == "__main__":
    main()

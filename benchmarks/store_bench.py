"""Store benchmark: write a 30-layer run at 8k and 32k tokens, fetch one layer's heatmap.

    python -m sketchwalk.benchmarks.store_bench [--db-dir DIR] [--layers 30] [--tokens 8192 32768]

Synthetic but shaped like real records: per layer a causal row-stochastic block matrix (sketch),
walk scores, exact mass and a 20% selection, 64-token blocks. Prints a table: write time, one
heatmap fetch (median of repeats), rows written and the DuckDB file growth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from sketchwalk.engine.run.records import BlockSpan, LayerRecord, RunResult, TokenRecord
from sketchwalk.store import open_store


def _causal_softmax(rng: np.random.Generator, n: int) -> np.ndarray:
    logits = rng.standard_normal((n, n), dtype=np.float32) * 2.0
    logits[np.triu_indices(n, 1)] = -np.inf
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True)


def synthetic_run(tokens: int, layers: int = 30, block_size: int = 64, seed: int = 0) -> RunResult:
    """A prefill-only run with every matrix recorded, like the recorder's output at `tokens`."""
    rng = np.random.default_rng(seed)
    n = -(-tokens // block_size)
    recs = []
    for layer in range(layers):
        sketch = _causal_softmax(rng, n)
        walk = 0.75 * sketch + 0.25 * (sketch @ sketch)
        exact = _causal_softmax(rng, n)
        selected = walk >= np.quantile(walk, 0.9, axis=1, keepdims=True)
        recs.append(
            LayerRecord(
                phase="prefill",
                step=0,
                layer=layer,
                dense=layer < 2,
                n_blocks=n,
                q_blocks=np.arange(n),
                sketch=sketch,
                walk=walk,
                exact=exact,
                selected=selected,
                density_target=0.2,
                density_achieved=float(selected.mean()),
                sketch_error=0.1,
                mass_recall=0.9,
                t_sketch_ms=1.0,
                t_walk_ms=1.0,
                t_select_ms=1.0,
                t_attention_ms=10.0,
                t_dense_ms=30.0,
            )
        )
    return RunResult(
        model_id="synthetic",
        model_hash=None,
        prompt="x" * 200,
        prompt_tokens=tokens,
        method="sketchwalk",
        config={"density": 0.2, "block_size": block_size},
        device="cpu",
        versions={},
        dense_text="",
        sparse_text="",
        metrics={},
        timings={},
        layers=recs,
        blocks=[
            BlockSpan(b, b * block_size, min(tokens, (b + 1) * block_size), f"block {b}")
            for b in range(n)
        ],
        tokens=[
            TokenRecord("dense", i, i % 49152, f"t{i}", -1.0 if i else None) for i in range(tokens)
        ],
    )


def _size(path: Path) -> int:
    wal = path.with_name(path.name + ".wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def bench_one(db_path: Path, tokens: int, layers: int, repeats: int = 7) -> dict:
    result = synthetic_run(tokens, layers)
    n = result.layers[0].n_blocks
    rows = layers * n * (n + 1) // 2
    with open_store(str(db_path)) as store:
        store.create_run({"prompt": "warm up"})  # schema + connection ready, not timed
        size0 = _size(db_path)
        t0 = time.perf_counter()
        run_id = store.create_run({"prompt": result.prompt, "model": result.model_id})
        store.save_result(run_id, result)
        write_s = time.perf_counter() - t0
        fetches = []
        for i in range(repeats):
            t0 = time.perf_counter()
            hm = store.heatmap(run_id, "prefill", 0, (7 + 5 * i) % layers)
            fetches.append(time.perf_counter() - t0)
        assert hm["sketch"].shape == (n, n)
        t0 = time.perf_counter()
        store.layer_stats(run_id)
        stats_s = time.perf_counter() - t0
    size = _size(db_path) - size0
    return {
        "tokens": tokens,
        "blocks": n,
        "layers": layers,
        "block_rows": rows,
        "write_s": write_s,
        "heatmap_ms_median": 1000 * statistics.median(fetches),
        "heatmap_ms_max": 1000 * max(fetches),
        "layer_stats_ms": 1000 * stats_s,
        "file_mb": size / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--db-dir", type=Path, help="where to put the benchmark databases (temp dir)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.db_dir) as tmp:
        results = [bench_one(Path(tmp) / f"bench_{t}.duckdb", t, args.layers) for t in args.tokens]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        "| tokens | blocks | layers | block rows | write s | heatmap ms (median / max) | file MB |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['tokens']} | {r['blocks']} | {r['layers']} | {r['block_rows']:,} "
            f"| {r['write_s']:.2f} | {r['heatmap_ms_median']:.1f} / {r['heatmap_ms_max']:.1f} "
            f"| {r['file_mb']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

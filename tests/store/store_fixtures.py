"""Helpers for store tests: synthetic RunResults of realistic shapes, row counts per run."""

from __future__ import annotations

import numpy as np

from sketchwalk.engine.run.records import BlockSpan, LayerRecord, RunResult, TokenRecord
from sketchwalk.store import Store


def make_result(
    n_blocks: int = 12,
    n_layers: int = 4,
    decode_steps: int = 3,
    seed: int = 0,
    block_size: int = 4,
) -> RunResult:
    """A run like the engine's: prefill records (dense first layer, one layer without exact),
    decode records with a single row whose block count grows, blocks and tokens of two variants."""
    rng = np.random.default_rng(seed)
    layers: list[LayerRecord] = []
    n = n_blocks
    for layer in range(n_layers):
        sketch = rng.random((n, n), dtype=np.float32)
        dense = layer == 0
        layers.append(
            LayerRecord(
                phase="prefill",
                step=0,
                layer=layer,
                dense=dense,
                n_blocks=n,
                q_blocks=np.arange(n),
                sketch=sketch,
                walk=None if dense else rng.random((n, n), dtype=np.float32),
                exact=None if layer == 2 else rng.random((n, n), dtype=np.float32),
                selected=None if dense else rng.random((n, n)) < 0.3,
                density_target=None if dense else 0.2,
                density_achieved=1.0 if dense else float(rng.random()),
                sketch_error=float(rng.random()),
                walk_error=None if dense else float(rng.random()),
                mass_recall=None if layer == 2 else float(rng.random()),
                t_sketch_ms=float(rng.random()),
                t_walk_ms=float(rng.random()),
                t_select_ms=float(rng.random()),
                t_attention_ms=float(rng.random()),
                t_dense_ms=float(rng.random()),
            )
        )
    for step in range(1, decode_steps + 1):
        m = n + (1 if step == decode_steps else 0)  # a new key block forms on the last step
        for layer in range(n_layers):
            layers.append(
                LayerRecord(
                    phase="decode",
                    step=step,
                    layer=layer,
                    dense=layer == 0,
                    n_blocks=m,
                    q_blocks=np.array([m - 1]),
                    sketch=rng.random((1, m), dtype=np.float32),
                    walk=rng.random((1, m), dtype=np.float32),
                    exact=rng.random((1, m), dtype=np.float32),
                    selected=rng.random((1, m)) < 0.5,
                    density_target=0.2,
                    density_achieved=float(rng.random()),
                    t_attention_ms=float(rng.random()),
                )
            )
    tokens_n = n * block_size
    tokens = []
    for variant in ("dense", "sparse"):
        for pos in range(tokens_n + decode_steps):
            tokens.append(
                TokenRecord(
                    variant=variant,
                    position=pos,
                    token_id=int(rng.integers(0, 49152)),
                    text=f"tok{pos} ünï'\"",
                    logprob=None if pos == 0 else -float(rng.random()),
                    kl=float(rng.random()) if variant == "sparse" and pos > 0 else None,
                )
            )
    return RunResult(
        model_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        model_hash="abc123",
        prompt="The capital of France is'; DROP TABLE runs; --",
        prompt_tokens=tokens_n,
        method="sketchwalk",
        config={"density": 0.2, "beta": np.float32(0.25), "dense_layers": (0, 1)},
        device="cpu",
        versions={"torch": "2.13.0", "transformers": "5.24.0", "sketchwalk": "0.1.0"},
        dense_text=" Paris.",
        sparse_text=" Paris!",
        metrics={"kl": 0.01, "top1": 0.9, "ppl_dense": float("nan")},
        timings={"dense_ms": 12.0, "sparse_ms": 5.0},
        layers=layers,
        blocks=[
            BlockSpan(b, b * block_size, min((b + 1) * block_size, tokens_n), f"block {b}")
            for b in range(n)
        ],
        tokens=tokens,
    )


REQUEST = {
    "prompt": "The capital of France is'; DROP TABLE runs; --",
    "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "config": {"density": 0.2},
    "method": "sketchwalk",
}


def saved_run(store: Store, **kwargs) -> tuple[str, RunResult]:
    """Create a run, save a synthetic result into it, and return both."""
    result = make_result(**kwargs)
    run_id = store.create_run(dict(REQUEST), status="running")
    store.save_result(run_id, result)
    return run_id, result


def count_rows(store: Store, run_id: str) -> dict[str, int]:
    """Rows per run table (and jobs) that belong to `run_id`."""
    import sqlalchemy as sa

    from sketchwalk.store import schema

    out = {}
    with store.engine.connect() as conn:
        for table in (*schema.RUN_TABLES, schema.jobs):
            key = schema.run_key(table)
            out[table.name] = conn.execute(
                sa.select(sa.func.count()).select_from(table).where(key == run_id)
            ).scalar()
    return out

"""Export zips shaped like the import bombs of issue 50, built from an honest one-run export:
small on disk, large once inflated (zip level) or decoded (Parquet level). Each returns the zip.

- near-cap: tokens.parquet decodes to just under the 1024 MiB decoded cap (a ~1 MB zip);
- inflation: a 2,000 MB uncompressed tokens.parquet deflated into a few-MB zip (over the cap);
- padded: a ~940 MB uncompressed tokens.parquet deflated into a few-MB zip (under the caps);
- near-cap-prompt: as near-cap, but the rows are the sparse model's prompt (what a needle
  search reads) with one pass-key sentence in its middle (NEEDLE);
- near-cap-scores: block_scores just under the decoded cap: two prefill layers of the widest
  the explorer draws (4,096 blocks), the first whole (8.4M causal pairs), with their blocks and
  16,384 prompt tokens.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TEXT_CHARS = 1000
ROWS = {
    "near-cap": 940_000,
    "inflation": 2_000_000,
    "padded": 940_000,
    "near-cap-prompt": 940_000,
    "near-cap-scores": 2 * 16_384,
}
"""Token rows of each shape (a run may hold 2 x 1,048,576): rows x 1,000 characters of text."""
NEEDLE = "The pass key is 31415. Remember it."
"""The one sentence of near-cap-prompt's prompt that is not padding (token rows // 2)."""
WIDE = 4096
"""Key blocks of each layer of near-cap-scores (Settings.view_max_blocks, the widest drawn)."""
SECOND_ROWS = 3033
"""Query blocks of near-cap-scores' second layer: 12.99M block_scores rows in all, ~980 MiB."""


def _tokens(
    run_id: str, rows: int, plain: bool, path: Path, variant: str = "dense", needle: bool = False
) -> None:
    """`rows` token rows of one 1,000-character text, written in row groups of 65,536 rows;
    `plain`: no dictionary, no compression (the file is as large as its data); `needle`: row
    rows // 2 holds NEEDLE instead."""
    writer = None
    text = "x" * TEXT_CHARS
    for start in range(0, rows, 1 << 16):
        n = min(1 << 16, rows - start)
        texts = [text] * n
        if needle and start <= rows // 2 < start + n:
            texts[rows // 2 - start] = NEEDLE
        batch = pa.table(
            {
                "run_id": pa.array([run_id] * n),
                "variant": pa.array([variant] * n),
                "position": pa.array(np.arange(start, start + n, dtype=np.int32)),
                "token_id": pa.array(np.zeros(n, dtype=np.int32)),
                "text": pa.array(texts),
                "logprob": pa.nulls(n, pa.float64()),
                "kl": pa.nulls(n, pa.float64()),
            }
        )
        if writer is None:
            options = {"compression": "none", "use_dictionary": False} if plain else {}
            writer = pq.ParquetWriter(path, batch.schema, **options)
        writer.write_table(batch)
    writer.close()


def _scores(run_id: str, folder: Path) -> dict[str, int]:
    """near-cap-scores' layer_stats, block_scores, blocks and tokens files; their row counts."""
    layers = {0: WIDE, 1: SECOND_ROWS}  # layer -> query blocks recorded (all keys causal)
    schema = pq.read_schema(folder / "layer_stats.parquet")
    stats = [
        {
            **dict.fromkeys(schema.names),
            "run_id": run_id,
            "phase": "prefill",
            "step": 0,
            "layer": layer,
            "dense": False,
            "n_blocks": WIDE,
            "q_blocks": json.dumps(list(range(q_rows))),
            "density_target": 0.2,
            "density_achieved": 0.2,
        }
        for layer, q_rows in layers.items()
    ]
    pq.write_table(pa.Table.from_pylist(stats, schema=schema), folder / "layer_stats.parquet")
    scores = 0
    with pq.ParquetWriter(
        folder / "block_scores.parquet", _score_batch(run_id, 0, 0, 1).schema
    ) as w:
        for layer, q_rows in layers.items():
            for q0 in range(0, q_rows, 64):
                batch = _score_batch(run_id, layer, q0, min(q0 + 64, q_rows))
                scores += batch.num_rows
                w.write_table(batch)
    block_size = 4
    tokens = WIDE * block_size
    pq.write_table(
        pa.table(
            {
                "run_id": pa.array([run_id] * WIDE),
                "block": pa.array(np.arange(WIDE, dtype=np.int32)),
                "token_start": pa.array(np.arange(WIDE, dtype=np.int32) * block_size),
                "token_end": pa.array(np.arange(1, WIDE + 1, dtype=np.int32) * block_size),
                "text": pa.array([f"block {b}" for b in range(WIDE)]),
            }
        ),
        folder / "blocks.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "run_id": pa.array([run_id] * 2 * tokens),
                "variant": pa.array(["dense"] * tokens + ["sparse"] * tokens),
                "position": pa.array(np.tile(np.arange(tokens, dtype=np.int32), 2)),
                "token_id": pa.array(np.zeros(2 * tokens, dtype=np.int32)),
                "text": pa.array([f" w{p}" for p in range(tokens)] * 2),
                "logprob": pa.nulls(2 * tokens, pa.float64()),
                "kl": pa.nulls(2 * tokens, pa.float64()),
            }
        ),
        folder / "tokens.parquet",
    )
    runs = pq.read_table(folder / "runs.parquet")
    at = runs.schema.get_field_index("prompt_tokens")
    runs = runs.set_column(at, "prompt_tokens", pa.array([tokens], pa.int32()))
    pq.write_table(runs, folder / "runs.parquet")
    return {"layer_stats": len(stats), "block_scores": scores, "blocks": WIDE, "tokens": 2 * tokens}


def _score_batch(run_id: str, layer: int, q0: int, q1: int) -> pa.Table:
    """Every causal pair (q, k <= q) of query blocks q0..q1 of one layer, low-entropy scores."""
    q = np.concatenate([np.full(i + 1, i, dtype=np.int32) for i in range(q0, q1)])
    k = np.concatenate([np.arange(i + 1, dtype=np.int32) for i in range(q0, q1)])
    n = q.size
    score = ((q - k) % 8).astype(np.float32) / 8
    return pa.table(
        {
            "run_id": pa.array([run_id] * n),
            "phase": pa.array(["prefill"] * n),
            "step": pa.array(np.zeros(n, dtype=np.int32)),
            "layer": pa.array(np.full(n, layer, dtype=np.int32)),
            "q_block": pa.array(q),
            "k_block": pa.array(k),
            "sketch": pa.array(score),
            "walk": pa.array(score),
            "exact": pa.array(score),
            "selected": pa.array(q - k < 4),
        }
    )


def build(shape: str, export_dir: Path, work: Path) -> Path:
    """The zip of `shape` (see the module doc), from `export_dir`, under `work`."""
    folder = work / shape
    shutil.copytree(export_dir, folder)
    run_id = pq.read_table(folder / "runs.parquet")["id"][0].as_py()
    rows = {"tokens": ROWS[shape]}
    if shape == "near-cap-scores":
        rows = _scores(run_id, folder)
    elif shape == "near-cap-prompt":
        _tokens(run_id, rows["tokens"], False, folder / "tokens.parquet", "sparse", needle=True)
        runs = pq.read_table(folder / "runs.parquet")
        at = runs.schema.get_field_index("prompt_tokens")
        runs = runs.set_column(at, "prompt_tokens", pa.array([rows["tokens"]], pa.int32()))
        pq.write_table(runs, folder / "runs.parquet")
    else:
        _tokens(run_id, rows["tokens"], plain=shape != "near-cap", path=folder / "tokens.parquet")
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, count in rows.items():
        manifest["tables"][name]["rows"] = count
    (folder / "manifest.json").write_text(json.dumps(manifest))
    out = work / f"{shape}.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for file in sorted(folder.iterdir()):
            zf.write(file, file.name)
    shutil.rmtree(folder)
    return out

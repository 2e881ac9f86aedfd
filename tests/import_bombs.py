"""Export zips shaped like the import bombs of issue 50, built from an honest one-run export:
small on disk, large once inflated (zip level) or decoded (Parquet level). Each returns the zip.

- near-cap: tokens.parquet decodes to just under the 1024 MiB decoded cap (a ~1 MB zip);
- inflation: a 2,000 MB uncompressed tokens.parquet deflated into a few-MB zip (over the cap);
- padded: a ~940 MB uncompressed tokens.parquet deflated into a few-MB zip (under the caps).
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
ROWS = {"near-cap": 940_000, "inflation": 2_000_000, "padded": 940_000}
"""Token rows of each shape (a run may hold 2 x 1,048,576): rows x 1,000 characters of text."""


def _tokens(run_id: str, rows: int, plain: bool, path: Path) -> None:
    """`rows` token rows of one 1,000-character text, written in row groups of 65,536 rows;
    `plain`: no dictionary, no compression (the file is as large as its data)."""
    writer = None
    text = "x" * TEXT_CHARS
    for start in range(0, rows, 1 << 16):
        n = min(1 << 16, rows - start)
        batch = pa.table(
            {
                "run_id": pa.array([run_id] * n),
                "variant": pa.array(["dense"] * n),
                "position": pa.array(np.arange(start, start + n, dtype=np.int32)),
                "token_id": pa.array(np.zeros(n, dtype=np.int32)),
                "text": pa.array([text] * n),
                "logprob": pa.nulls(n, pa.float64()),
                "kl": pa.nulls(n, pa.float64()),
            }
        )
        if writer is None:
            options = {"compression": "none", "use_dictionary": False} if plain else {}
            writer = pq.ParquetWriter(path, batch.schema, **options)
        writer.write_table(batch)
    writer.close()


def build(shape: str, export_dir: Path, work: Path) -> Path:
    """The zip of `shape` (see the module doc), from `export_dir`, under `work`."""
    folder = work / shape
    shutil.copytree(export_dir, folder)
    run_id = pq.read_table(folder / "runs.parquet")["id"][0].as_py()
    rows = ROWS[shape]
    _tokens(run_id, rows, plain=shape != "near-cap", path=folder / "tokens.parquet")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tables"]["tokens"]["rows"] = rows
    (folder / "manifest.json").write_text(json.dumps(manifest))
    out = work / f"{shape}.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for file in sorted(folder.iterdir()):
            zf.write(file, file.name)
    shutil.rmtree(folder)
    return out

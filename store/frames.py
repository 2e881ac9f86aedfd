"""Turn a RunResult into columnar tables (pyarrow), one per store table.

Block matrices become rows (q_block, k_block, sketch, walk, exact, selected) for causal pairs only
(k_block <= q_block), built with vectorised numpy so a 30-layer, 512-block run (about 4M rows)
takes well under a second before it reaches the database.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sketchwalk.engine.run.records import BlockSpan, LayerRecord, RunResult, TokenRecord
from sketchwalk.store import jsonio, limits
from sketchwalk.store.errors import InvalidResultError

NUL_STAND_IN = "\ufffd"
"""What a NUL in model output is stored as: PostgreSQL text cannot hold NUL, and an export of a
DuckDB store holding one would be refused by a PostgreSQL import."""


def clean_text(text: object) -> str:
    """Model-made text as the store keeps it, on every database: NUL replaced."""
    return str(text).replace("\x00", NUL_STAND_IN)


def clean_strings(data: pa.Table) -> pa.Table:
    """`data` with NUL replaced in every string column (exports of stores written before)."""
    for i, field in enumerate(data.schema):
        column = data.column(i)
        if field.type == pa.string() and pc.any(pc.match_substring(column, "\x00")).as_py():
            data = data.set_column(i, field, pc.replace_substring(column, "\x00", NUL_STAND_IN))
    return data


def check_limits(tables: dict[str, pa.Table], fields: dict) -> None:
    """Refuse a result past the store's limits (store/limits.py), which an import would refuse."""
    runs = pa.table({"prompt_tokens": pa.array([fields["prompt_tokens"]], pa.int64())})
    for name, data in {"runs": runs, **tables}.items():
        over = limits.first_over(name, data)
        if over is not None:
            raise InvalidResultError(f"the result's {name} has {over}; it cannot be stored")


MATRICES = ("sketch", "walk", "exact", "selected")
LAYER_SCALARS = (
    "density_target",
    "density_achieved",
    "sketch_error",
    "walk_error",
    "mass_recall",
    "t_sketch_ms",
    "t_walk_ms",
    "t_select_ms",
    "t_attention_ms",
    "t_dense_ms",
)


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _where(rec: LayerRecord) -> str:
    return f"layer record (phase={rec.phase!r}, step={rec.step}, layer={rec.layer})"


def _check_layer(rec: LayerRecord) -> np.ndarray:
    """Validate one record's shapes; return its q_blocks as int64."""
    n = int(rec.n_blocks)
    q = np.asarray(rec.q_blocks, dtype=np.int64).reshape(-1)
    if n < 0 or (q.size and (q.min() < 0 or q.max() >= n)):
        raise InvalidResultError(f"{_where(rec)}: q_blocks must lie in [0, {n})")
    for name in MATRICES:
        m = getattr(rec, name)
        if m is not None and np.shape(m) != (q.size, n):
            raise InvalidResultError(
                f"{_where(rec)}: {name} has shape {np.shape(m)}, expected ({q.size}, {n})"
            )
    return q


def layer_stats_table(layers: Sequence[LayerRecord]) -> pa.Table:
    """One row per (phase, step, layer): densities, errors, timings and the row -> q_block map."""
    seen: set[tuple[str, int, int]] = set()
    cols: dict[str, list] = {
        k: [] for k in ("phase", "step", "layer", "dense", "n_blocks", "q_blocks", *LAYER_SCALARS)
    }
    for rec in layers:
        key = (str(rec.phase), int(rec.step), int(rec.layer))
        if key in seen:
            raise InvalidResultError(f"{_where(rec)} appears twice")
        seen.add(key)
        q = _check_layer(rec)
        cols["phase"].append(key[0])
        cols["step"].append(key[1])
        cols["layer"].append(key[2])
        cols["dense"].append(bool(rec.dense))
        cols["n_blocks"].append(int(rec.n_blocks))
        cols["q_blocks"].append(jsonio.dumps(q.tolist()))
        for name in LAYER_SCALARS:
            cols[name].append(_opt_float(getattr(rec, name)))
    types = {
        "phase": pa.string(),
        "step": pa.int32(),
        "layer": pa.int32(),
        "dense": pa.bool_(),
        "n_blocks": pa.int32(),
        "q_blocks": pa.string(),
        **{name: pa.float64() for name in LAYER_SCALARS},
    }
    return pa.table({k: pa.array(v, type=types[k]) for k, v in cols.items()})


def _causal_pairs(q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row index, key block) of every causal pair k_block <= q_blocks[row]."""
    rows, ks = np.nonzero(np.arange(n)[None, :] <= q[:, None])
    return rows, ks


def block_scores_table(layers: Sequence[LayerRecord]) -> pa.Table:
    """Causal block pairs of every record that carries at least one matrix, in record order."""
    phase_codes: dict[str, int] = {}
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("phase", "step", "layer", "q_block", "k_block", *MATRICES)
    }
    masks: dict[str, list[np.ndarray]] = {name: [] for name in MATRICES}
    for rec in layers:
        if all(getattr(rec, name) is None for name in MATRICES):
            continue
        q = _check_layer(rec)
        rows, ks = _causal_pairs(q, int(rec.n_blocks))
        count = rows.size
        code = phase_codes.setdefault(str(rec.phase), len(phase_codes))
        parts["phase"].append(np.full(count, code, dtype=np.int32))
        parts["step"].append(np.full(count, int(rec.step), dtype=np.int32))
        parts["layer"].append(np.full(count, int(rec.layer), dtype=np.int32))
        parts["q_block"].append(q[rows].astype(np.int32))
        parts["k_block"].append(ks.astype(np.int32))
        for name in MATRICES:
            m = getattr(rec, name)
            dtype = np.bool_ if name == "selected" else np.float32
            if m is None:
                parts[name].append(np.zeros(count, dtype=dtype))
                masks[name].append(np.ones(count, dtype=np.bool_))
            else:
                parts[name].append(np.asarray(m)[rows, ks].astype(dtype, copy=False))
                masks[name].append(np.zeros(count, dtype=np.bool_))

    def cat(name: str, dtype: type) -> np.ndarray:
        return np.concatenate(parts[name]) if parts[name] else np.zeros(0, dtype=dtype)

    dictionary = pa.array(list(phase_codes), type=pa.string())
    columns = {
        "phase": pa.DictionaryArray.from_arrays(pa.array(cat("phase", np.int32)), dictionary),
        "step": pa.array(cat("step", np.int32)),
        "layer": pa.array(cat("layer", np.int32)),
        "q_block": pa.array(cat("q_block", np.int32)),
        "k_block": pa.array(cat("k_block", np.int32)),
    }
    for name in MATRICES:
        dtype = np.bool_ if name == "selected" else np.float32
        mask = np.concatenate(masks[name]) if masks[name] else np.zeros(0, dtype=np.bool_)
        columns[name] = pa.array(cat(name, dtype), mask=mask if mask.any() else None)
    return pa.table(columns)


def blocks_table(spans: Sequence[BlockSpan]) -> pa.Table:
    return pa.table(
        {
            "block": pa.array([int(s.block) for s in spans], type=pa.int32()),
            "token_start": pa.array([int(s.start) for s in spans], type=pa.int32()),
            "token_end": pa.array([int(s.end) for s in spans], type=pa.int32()),
            "text": pa.array([clean_text(s.text) for s in spans], type=pa.string()),
        }
    )


def tokens_table(toks: Sequence[TokenRecord]) -> pa.Table:
    return pa.table(
        {
            "variant": pa.array([str(t.variant) for t in toks], type=pa.string()),
            "position": pa.array([int(t.position) for t in toks], type=pa.int32()),
            "token_id": pa.array([int(t.token_id) for t in toks], type=pa.int32()),
            "text": pa.array([clean_text(t.text) for t in toks], type=pa.string()),
            "logprob": pa.array([_opt_float(t.logprob) for t in toks], type=pa.float64()),
            "kl": pa.array([_opt_float(t.kl) for t in toks], type=pa.float64()),
        }
    )


def run_fields(result: RunResult) -> dict:
    """The runs-table columns a finished result fills in."""
    return {
        "model_id": str(result.model_id),
        "model_hash": result.model_hash,
        "prompt": str(result.prompt),
        "prompt_tokens": int(result.prompt_tokens),
        "method": str(result.method),
        "config": jsonio.dumps(result.config),
        "device": str(result.device),
        "versions": jsonio.dumps(result.versions),
        "dense_text": clean_text(result.dense_text),
        "sparse_text": clean_text(result.sparse_text),
        "metrics": jsonio.dumps(result.metrics),
        "timings": jsonio.dumps(result.timings),
    }

"""Dense attention vs our block-sparse path, side by side in one process.

Why it is built this way: absolute times on shared machines drift by +-20%, so dense and sparse runs
are interleaved (order alternating per repeat) and each reported time is a median; speedups are the
honest number. The sparse time INCLUDES the selection (sketch + walk + select from
sketchwalk.engine.method.pipeline.prefill_selection): that is what a user pays. Inputs are random (seeded),
so the selection pattern is what the method picks on noise, not on a real model's activations.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sketchwalk.engine.clock import timed
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.kernels import block_sparse_attention, choose_backend
from sketchwalk.kernels.lists import BlockLists


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int


SHAPES = {
    "smollm2": Shape("smollm2", 9, 3, 64),  # SmolLM2-135M
    "llama3-8b": Shape("llama3-8b", 32, 8, 128),  # Llama-3.1-8B
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _flash_attn_2() -> Callable | None:
    try:
        from flash_attn import flash_attn_func
    except Exception:  # not installed, or built for another torch
        return None
    return flash_attn_func


def decode_block_list(
    n_blocks: int, density: float, sink: int, window: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode-step list of the given density: sinks, the local window, the rest spread evenly.

    Decode kernel cost depends on how many blocks are read, not on which ones.
    """
    keep = max(1, min(n_blocks, math.ceil(density * n_blocks)))
    ids = set(range(min(sink, n_blocks))) | set(range(max(0, n_blocks - window), n_blocks))
    rest = [j for j in range(n_blocks) if j not in ids]
    extra = max(0, keep - len(ids))
    if extra and rest:
        step = len(rest) / extra
        ids |= {rest[int(i * step)] for i in range(min(extra, len(rest)))}
    ids_t = torch.tensor(sorted(ids), dtype=torch.int32, device=device)
    return ids_t.view(1, 1, 1, -1), torch.tensor(
        [[[ids_t.numel()]]], dtype=torch.int32, device=device
    )


def _median_pairs(
    dense: Callable[[], object],
    sparse: Callable[[], tuple[float, float]],
    repeats: int,
    device: torch.device,
    peers: dict[str, Callable[[], object]] | None = None,
) -> tuple[float, float, float, dict[str, float]]:
    """(dense_ms, overhead_ms, kernel_ms, {peer: ms}) medians; one warm-up each, order rotating.

    peers: more contenders timed in the same rotation (FlexAttention on the same lists; the
    decode paths a session takes).
    """
    peers = peers or {}
    calls: dict[str, Callable[[], object]] = {"dense": dense, "sparse": sparse, **peers}
    for fn in calls.values():
        fn()
    ms: dict[str, list[float]] = {name: [] for name in calls}
    o_ms: list[float] = []
    names = list(calls)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name == "sparse":
                o, k = sparse()
                o_ms.append(o)
                ms[name].append(k)
            else:
                ms[name].append(timed(calls[name], device)[1])
    med = statistics.median
    return med(ms["dense"]), med(o_ms), med(ms["sparse"]), {p: med(ms[p]) for p in peers}


def _row(base: dict, dense_ms: float, overhead_ms: float, kernel_ms: float) -> dict:
    sparse_ms = overhead_ms + kernel_ms
    return {
        **base,
        "dense_ms": round(dense_ms, 3),
        "sparse_ms": round(sparse_ms, 3),
        "overhead_ms": round(overhead_ms, 3),
        "kernel_ms": round(kernel_ms, 3),
        "speedup": round(dense_ms / sparse_ms, 3),
        "kernel_speedup": round(dense_ms / kernel_ms, 3),
    }


@dataclass(frozen=True)
class BenchRun:
    """What every row of one bench run shares: the dtype, device and backend timed, how often,
    and the config besides density (knobs; block_size and query_block override it)."""

    dtype: torch.dtype
    device: torch.device
    repeats: int
    backend: str | None = None
    progress: Callable[[], None] | None = None
    flex: bool = False
    block_size: int | None = None
    query_block: int | None = None
    knobs: SketchWalkConfig | None = None

    def config(self, density: float) -> SketchWalkConfig:
        cfg = (self.knobs or SketchWalkConfig()).with_(density=density)
        if self.block_size is not None:
            cfg = cfg.with_(block_size=self.block_size)
        if self.query_block is not None:
            cfg = cfg.with_(query_block=self.query_block)
        return cfg

    def row(self, phase: str, shape: Shape, seq_len: int, block_size: int) -> dict:
        """The columns every row of this run starts with."""
        return {
            "phase": phase,
            "shape": shape.name,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": self.device.type,
            "backend": choose_backend(self.device, self.backend),
            "seq_len": seq_len,
            "block_size": block_size,
        }


def _random_qkv(
    shape: Shape, lq: int, lk: int, seed: int, run: BenchRun
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q [1, H, lq, D], k and v [1, Hkv, lk, D] in the run's dtype, on its device."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    kv = (1, shape.kv_heads, lk, shape.head_dim)
    q = torch.randn((1, shape.heads, lq, shape.head_dim), generator=gen).to(run.device, run.dtype)
    k = torch.randn(kv, generator=gen).to(run.device, run.dtype)
    v = torch.randn(kv, generator=gen).to(run.device, run.dtype)
    return q, k, v


def _fa2_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, run: BenchRun) -> float | None:
    """Dense flash-attn 2's median time (on CUDA in half precision, where it is installed): it
    does not depend on the density, so it is timed once per shape and length."""
    fa2 = _flash_attn_2() if run.device.type == "cuda" and run.dtype != torch.float32 else None
    if fa2 is None:
        return None
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    fa2(qt, kt, vt, causal=True)
    return statistics.median(
        timed(lambda: fa2(qt, kt, vt, causal=True), run.device)[1] for _ in range(run.repeats)
    )


def bench_prefill(
    shape: Shape, seq_len: int, densities: Iterable[float], run: BenchRun
) -> list[dict]:
    """A seq_len prompt per density: dense SDPA against the selection plus our kernel (and
    FlexAttention on the same lists, and flash-attn 2, where asked for and available)."""
    from sketchwalk.engine.method.pipeline import prefill_selection, sparse_attention

    device, backend = run.device, run.backend
    q, k, v = _random_qkv(shape, seq_len, seq_len, seq_len, run)
    fa_ms = _fa2_ms(q, k, v, run)
    rows = []
    for density in densities:
        cfg = run.config(density)
        state: dict = {}

        def sparse(cfg=cfg, state=state) -> tuple[float, float]:
            sel, o_ms = timed(lambda: prefill_selection(q, k, cfg, 5), device)
            state["sel"] = sel
            call = lambda: sparse_attention(cfg, sel, q, k, v, backend=backend)  # noqa: E731
            return o_ms, timed(call, device)[1]

        def dense() -> object:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        peers, flex_extra = {}, {}
        if run.flex:
            peers["flex"], flex_extra = _flex_peer(q, k, v, cfg, backend, device)
        d_ms, o_ms, k_ms, peer_ms = _median_pairs(dense, sparse, run.repeats, device, peers)
        p_ms = peer_ms.get("flex")
        base = {
            **run.row("prefill", shape, seq_len, cfg.block_size),
            "query_block": cfg.query_block or cfg.block_size,
            "density": density,
            "achieved_density": round(state["sel"].density, 4),
        }
        row = _row(base, d_ms, o_ms, k_ms)
        if p_ms is not None:
            row["flex_ms"] = round(p_ms, 3)
            row["flex_speedup"] = round(d_ms / p_ms, 3)
            row.update(flex_extra)
        if fa_ms is not None:
            row["fa2_ms"] = round(fa_ms, 3)
            row["fa2_speedup"] = round(fa_ms / row["sparse_ms"], 3)
        rows.append(row)
        if run.progress:
            run.progress()
    return rows


def _flex_peer(q, k, v, cfg, backend, device) -> tuple[Callable[[], object], dict]:
    """FlexAttention on the lists our kernel runs (selection made once, outside the timing);
    returns the call and its agreement with our output and its BlockMask build time."""
    from sketchwalk.engine.method.pipeline import prefill_selection
    from sketchwalk.kernels import flex

    lists = prefill_selection(q, k, cfg, 5)
    t = q.shape[2]
    mask, mask_ms = timed(lambda: flex.block_mask(lists, q.shape[1], t, t), device)
    ours = block_sparse_attention(q, k, v, lists, backend=backend)
    theirs = flex.flex_attend(q, k, v, mask)  # compiles on first use
    diff = float((ours.float() - theirs.float()).abs().max())
    return (lambda: flex.flex_attend(q, k, v, mask)), {
        "flex_mask_ms": round(mask_ms, 3),
        "flex_max_diff": diff,
    }


def _decode_paths(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    scale: float,
) -> dict[str, Callable[[], object]]:
    """The paths a session's decode takes on CPU (engine/hf/session.py, decode_reselect 0): a
    selection kept across steps, gathered once ("kept"), and a step that selects afresh, which
    gathers its selection and attends ("fresh"); re-selecting every token (decode_reselect 1)
    runs the stateless kernel (kernel_ms). None of them where the lists leave out the current
    block (then decode takes the stateless kernel)."""
    from sketchwalk.kernels import decode_cache

    idx, cnt, b, lk = lists.index, lists.count, lists.block_size, k.shape[2]
    if q.device.type != "cpu" or not bool((idx == -(-lk // b) - 1).any()):
        return {}
    g = decode_cache.gather(k, v, idx, cnt, b, lk)

    def fresh() -> torch.Tensor:
        return decode_cache.attend(decode_cache.gather(k, v, idx, cnt, b, lk), q, k, v, scale)

    return {"kept": lambda: decode_cache.attend(g, q, k, v, scale), "fresh": fresh}


def bench_decode(
    shape: Shape, seq_len: int, densities: Iterable[float], run: BenchRun
) -> list[dict]:
    """One query against a seq_len cache; the list comes from decode_block_list (no selection cost)."""
    device, backend = run.device, run.backend
    q, k, v = _random_qkv(shape, 1, seq_len, seq_len + 1, run)
    rows = []
    for density in densities:
        cfg = (run.knobs or SketchWalkConfig()).with_(density=density)
        b = run.block_size or cfg.block_size
        n = -(-seq_len // b)
        # the config's sink and window with their block floors; the current block always
        sink = max(math.ceil(cfg.sink * seq_len / b), getattr(cfg, "sink_blocks", 0))
        window = max(math.ceil(cfg.window * seq_len / b), getattr(cfg, "window_blocks", 0)) + 1
        idx, cnt = decode_block_list(n, density, sink, window, device)
        lists = BlockLists(idx, cnt, b)

        def sparse(idx=idx, cnt=cnt, b=b) -> tuple[float, float]:
            def call() -> torch.Tensor:
                return block_sparse_attention(q, k, v, BlockLists(idx, cnt, b), backend=backend)

            return 0.0, timed(call, device)[1]

        def dense() -> object:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        peers = _decode_paths(q, k, v, lists, shape.head_dim**-0.5)
        d_ms, o_ms, k_ms, peer_ms = _median_pairs(dense, sparse, max(run.repeats, 5), device, peers)
        base = {
            **run.row("decode", shape, seq_len, b),
            "density": density,
            "achieved_density": round(int(cnt.sum()) / n, 4),
        }
        row = _row(base, d_ms, o_ms, k_ms)
        for name, ms in peer_ms.items():
            row[f"{name}_ms"] = round(ms, 3)
            row[f"{name}_speedup"] = round(d_ms / ms, 3)
        rows.append(row)
        if run.progress:
            run.progress()
    return rows


def run_attention_bench(  # many parameters: the bench command's options, each a keyword (cli/bench.py)
    device: str | torch.device,
    seq_lens: Iterable[int],
    densities: Iterable[float],
    shapes: Iterable[str],
    repeats: int = 3,
    backend: str | None = None,
    dtype: str = "fp32",
    phases: Iterable[str] = ("prefill",),
    progress: Callable[[], None] | None = None,
    flex: bool = False,
    block_size: int | None = None,
    query_block: int | None = None,
    knobs: SketchWalkConfig | None = None,
) -> list[dict]:
    """Rows of dense vs sparse timings, one per (phase, shape, seq_len, density); knobs: the
    config besides density (default: the defaults)."""
    run = BenchRun(
        DTYPES[dtype], torch.device(device), repeats, backend, progress, flex, block_size,
        query_block, knobs,
    )  # fmt: skip
    densities = list(densities)
    rows: list[dict] = []
    for name in shapes:
        shape = SHAPES[name]
        for seq_len in seq_lens:
            if "prefill" in phases:
                rows += bench_prefill(shape, seq_len, densities, run)
            if "decode" in phases:
                rows += bench_decode(shape, seq_len, densities, run)
    return rows


COLUMNS = [
    ("phase", "{}"),
    ("shape", "{}"),
    ("dtype", "{}"),
    ("backend", "{}"),
    ("seq_len", "{}"),
    ("block_size", "{}"),
    ("density", "{:.2f}"),
    ("achieved_density", "{:.3f}"),
    ("dense_ms", "{:.1f}"),
    ("overhead_ms", "{:.1f}"),
    ("kernel_ms", "{:.1f}"),
    ("sparse_ms", "{:.1f}"),
    ("speedup", "{:.2f}x"),
    ("kept_ms", "{:.1f}"),
    ("kept_speedup", "{:.2f}x"),
    ("fresh_ms", "{:.1f}"),
    ("fresh_speedup", "{:.2f}x"),
    ("flex_ms", "{:.1f}"),
    ("flex_speedup", "{:.2f}x"),
    ("flex_max_diff", "{:.1e}"),
    ("fa2_ms", "{:.1f}"),
    ("fa2_speedup", "{:.2f}x"),
]


def format_table(rows: list[dict]) -> str:
    """A plain aligned text table (only the columns some row has)."""
    cols = [(c, f) for c, f in COLUMNS if any(c in r for r in rows)]
    cells = [[c for c, _ in cols]]
    for r in rows:
        cells.append([f.format(r[c]) if c in r else "-" for c, f in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


__all__ = ["SHAPES", "format_table", "run_attention_bench"]

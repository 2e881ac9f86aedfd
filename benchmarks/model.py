"""Whole-model prefill and decode, dense (SDPA) against Sketch&Walk, interleaved in one process.

Why it is built this way: the attention benchmark times one layer on random inputs; users run a
whole model on text, where the MLPs, the embeddings and the LM head cost the same in both variants
and the per-layer Python, the selection and the decode bookkeeping come on top. So this benchmark
runs the real model on a real prompt: per repeat, dense then sparse (order alternating), each a
prefill of the prompt plus `new_tokens` greedy decode steps from its own cache, no recording. It
reports medians and ratios, and the sparse session's own stage totals (sketch, walk, select,
attention) so the remaining time is visible.

By default the prefill computes the logits of the last position only, as `model.generate` does
(`logits_to_keep=1`); `all_logits=True` computes all positions' logits, as a teacher-forced
evaluation (and `sketchwalk run`) does -- that adds the same LM-head cost to both variants.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.speed import Ceiling
from sketchwalk.engine.run.timing import Pass, run_variant

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")  # the issue-12 prompt


def prompt_ids(tokenizer, text: str, n_tokens: int) -> torch.Tensor:
    """The first n_tokens tokens of text (repeated if it is too short), shape [1, n]."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if not ids:
        raise ValueError("the prompt text has no tokens")
    while len(ids) < n_tokens:
        ids = ids + ids
    return torch.tensor([ids[:n_tokens]], dtype=torch.long)


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _ceiling(attn: float | None, whole: float, density: float) -> float | None:
    """The most the whole model can gain at this density from the dense pass's attention share
    (engine/run/speed.py Ceiling); None without a dense attention time."""
    c = Ceiling.of("", attn, whole, density)
    return None if c is None else round(c.at_density, 3)


def run_model_bench(  # many parameters: the bench command's options, each a keyword (cli/bench.py)
    model: torch.nn.Module,
    tokenizer,
    text: str,
    lengths: list[int],
    cfg: SketchWalkConfig,
    new_tokens: int = 8,
    repeats: int = 3,
    all_logits: bool = False,
    backend: str | None = None,
    progress: Callable[[], None] | None = None,
    token_ids: Callable[[int], torch.Tensor] | None = None,
) -> list[dict]:
    """One row per prompt length: medians of dense and sparse prefill and decode, and ratios.

    token_ids(n): the prompt of n tokens, for a model without a tokenizer (random weights:
    benchmarks/random_model.py); default the first n tokens of text."""
    device = next(model.parameters()).device
    rows = []
    for n in lengths:
        ids = prompt_ids(tokenizer, text, n) if token_ids is None else token_ids(n)
        ids = ids.to(device)
        dense: list[Pass] = []
        sparse: list[Pass] = []
        for rep in range(repeats):
            order = ("dense", "sparse") if rep % 2 == 0 else ("sparse", "dense")
            for which in order:
                if which == "dense":
                    dense.append(run_variant(model, ids, new_tokens, None, all_logits))
                else:
                    sparse.append(run_variant(model, ids, new_tokens, cfg, all_logits, backend))
                if progress is not None:
                    progress()
        settings = dict(
            seq_len=n,
            new_tokens=new_tokens,
            repeats=repeats,
            density=cfg.density,
            block_size=cfg.block_size,
            per_group=cfg.per_group,
            decode_reselect=cfg.decode_reselect,
            all_logits=all_logits,
        )
        rows.append({**settings, **_medians(dense, sparse, cfg.density, new_tokens)})
    return rows


def _medians(dense: list[Pass], sparse: list[Pass], density: float, new_tokens: int) -> dict:
    """A row's timings: medians over the dense and the sparse passes, and their ratios."""
    d_pre = _med([p.prefill_ms for p in dense])
    s_pre = _med([p.prefill_ms for p in sparse])
    # decode: each pass's mean step (what a generation pays: the steps that re-select, one
    # per key block, cost 2-3x the others, and a median step leaves them out), then the
    # median over passes; the median step is kept beside it
    d_dec = _med([statistics.fmean(p.decode_ms) for p in dense if p.decode_ms])
    s_dec = _med([statistics.fmean(p.decode_ms) for p in sparse if p.decode_ms])
    s_dec_med = _med([_med(p.decode_ms) for p in sparse])
    d_dec_med = _med([_med(p.decode_ms) for p in dense])
    # the slowest step after the first (which selects in every layer): the stutter a
    # generation shows where many layers re-select at the same token
    s_worst = _med([max(p.decode_ms[1:]) for p in sparse if len(p.decode_ms) > 1])
    stage_names = sorted({k for p in sparse for k in p.stages})
    stages = {k: _med([p.stages.get(k, 0.0) for p in sparse]) for k in stage_names}
    d_attn = {k: _med([p.stages[k] for p in dense]) for k in dense[0].stages}
    return dict(
        dense_prefill_ms=round(d_pre, 1),
        sparse_prefill_ms=round(s_pre, 1),
        prefill_speedup=round(d_pre / s_pre, 3),
        prefill_ceiling=_ceiling(d_attn.get("prefill_attention"), d_pre, density),
        dense_decode_ms=round(d_dec, 2),
        sparse_decode_ms=round(s_dec, 2),
        decode_speedup=round(d_dec / s_dec, 3) if new_tokens else None,
        decode_ceiling=_ceiling(d_attn.get("decode_attention"), d_dec, density),
        dense_decode_median_ms=round(d_dec_med, 2),
        sparse_decode_median_ms=round(s_dec_med, 2),
        sparse_decode_worst_ms=round(s_worst, 2),
        same_first_token=all(p.first_token == dense[0].first_token for p in sparse),
        dense_stages_ms={k: round(v, 1) for k, v in d_attn.items()},
        sparse_stages_ms={k: round(v, 1) for k, v in stages.items()},
    )


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'tokens':>7} {'block':>5} {'dens':>5} {'dense pre ms':>12} {'sparse pre ms':>13} "
        f"{'x':>6} {'ceil':>5} {'dense dec ms':>12} {'sparse dec ms':>13} {'x':>6} "
        f"{'ceil':>5} {'median x':>8} {'worst ms':>8}  "
        "attention alone dense/sparse, prefill ms | decode ms"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        d, sp = r["dense_stages_ms"], r["sparse_stages_ms"]
        st = f"{d['prefill_attention']:.0f}/{sp['prefill_attention']:.0f}"
        if "decode_attention" in d:
            st += f" | {d['decode_attention']:.1f}/{sp.get('decode_attention', 0.0):.1f}"
        overhead = [f"{k}={v:.1f}" for k, v in sp.items() if not k.endswith("attention")]
        st += "  (sparse selection: " + " ".join(overhead) + ")"
        dec = "-" if r["decode_speedup"] is None else f"{r['decode_speedup']:.2f}"
        med = "-"
        if r["decode_speedup"] is not None and r["sparse_decode_median_ms"] > 0:
            med = f"{r['dense_decode_median_ms'] / r['sparse_decode_median_ms']:.2f}"
        ceil = [
            "-" if c is None else f"{c:.2f}" for c in (r["prefill_ceiling"], r["decode_ceiling"])
        ]
        lines.append(
            f"{r['seq_len']:>7} {r['block_size']:>5} {r['density']:>5} "
            f"{r['dense_prefill_ms']:>12.0f} {r['sparse_prefill_ms']:>13.0f} "
            f"{r['prefill_speedup']:>6.2f} {ceil[0]:>5} {r['dense_decode_ms']:>12.1f} "
            f"{r['sparse_decode_ms']:>13.1f} {dec:>6} {ceil[1]:>5} {med:>8} "
            f"{r['sparse_decode_worst_ms']:>8.0f}  {st}"
        )
    return "\n".join(lines)

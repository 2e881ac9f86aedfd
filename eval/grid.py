"""The eval grid: every item through the dense model once, then through every (method, density).

Reuses the engine's own pieces (runner.greedy for prefill + greedy decoding from the cache,
sketch_walk_session for the sparse model, metrics for KL and log-likelihoods), so the numbers
are the ones `sketchwalk run` would give, minus the per-layer recording. What differs from the
runner: the dense pass is run ONCE per item and shared by every cell of the grid (the runner
repeats it per run), and metrics are reduced in row chunks so 8k-token prompts with a 49k vocab
never hold more than the two logit matrices.

A cell is (task, source, length, method, density); its row sums over the cell's items:
perplexity from total log-likelihood over all predicted tokens, mean KL(dense || sparse) and
top-1 agreement per token, exact-match accuracy for items with an answer, densities as kept /
candidate block pairs summed over items (prefill: sparse layers, and all layers; decode).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import sketchwalk
from sketchwalk.engine.hf.hook import NAME
from sketchwalk.engine.hf.session import Session, sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.metrics import kl_per_position, token_logprobs
from sketchwalk.engine.run.models import LoadedModel
from sketchwalk.engine.run.runner import Decoded, greedy
from sketchwalk.engine.run.timing import selection_ms, timed_dense
from sketchwalk.errors import SketchWalkError
from sketchwalk.eval.items import Item
from sketchwalk.eval.retrieval import is_correct
from sketchwalk.progress import Progress

_ROWS = 1024  # logit rows per metric chunk


@dataclass
class Pass:
    """One forward + greedy decode of an item, timed (the sparse one with its session counts)."""

    decoded: Decoded
    ms: float
    text: str  # the greedy continuation, decoded
    counts: dict[str, list[int]] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)  # ms: attention, sketch, walk, select


def dense_pass(lm: LoadedModel, ids: torch.Tensor, new_tokens: int) -> Pass:
    """The model's own SDPA, its attention timed (what a method's selection is measured against)."""
    with timed_dense(lm.model) as attention_ms:
        t0 = time.perf_counter()
        dec = greedy(lm.model, ids.to(lm.device), new_tokens, lm.tokenizer.eos_token_id)
        ms = (time.perf_counter() - t0) * 1e3
        stages = {"attention": attention_ms()}
    return Pass(dec, ms, _text(lm, dec), stages=stages)


def sparse_pass(
    lm: LoadedModel,
    ids: torch.Tensor,
    cfg: SketchWalkConfig,
    new_tokens: int,
    kernel_backend: str | None = None,
) -> Pass:
    """The same as the runner's sparse variant: one session over prefill and decode."""
    lm.model.set_attn_implementation(NAME)
    try:
        with sketch_walk_session(cfg, None, None, kernel_backend) as session:
            t0 = time.perf_counter()
            dec = greedy(lm.model, ids.to(lm.device), new_tokens, lm.tokenizer.eos_token_id)
            ms = (time.perf_counter() - t0) * 1e3
    finally:
        lm.model.set_attn_implementation("sdpa")
    return Pass(dec, ms, _text(lm, dec), _counts(session), dict(session.timings))


def _text(lm: LoadedModel, dec: Decoded) -> str:
    return lm.tokenizer.decode(dec.new_ids, skip_special_tokens=True) if dec.new_ids else ""


def _counts(session: Session) -> dict[str, list[int]]:
    """The session's pair tallies as ints (a selection counts them on its device)."""
    return {phase: [int(x) for x in c] for phase, c in session.counts.items()}


@torch.no_grad()  # the LM head's weights require grad: without this each chunk built a graph
def lm_sums(
    dense: torch.Tensor,
    sparse: torch.Tensor,
    ids: torch.Tensor,
    logits_fn: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.float,
) -> dict[str, float]:
    """Teacher-forced sums over a prompt (rows [T, .] predict ids[1:]), in row chunks.

    Rows are logits, or final hidden states with the LM head as `logits_fn`."""
    tgt = ids[1:].cpu()
    out = {"nll_dense": 0.0, "nll_sparse": 0.0, "kl": 0.0, "top1": 0.0, "n": float(len(tgt))}
    for s in range(0, len(tgt), _ROWS):
        e = min(len(tgt), s + _ROWS)
        d, sp = logits_fn(dense[s:e]), logits_fn(sparse[s:e])
        out["nll_dense"] -= float(token_logprobs(d, tgt[s:e]).sum())
        out["nll_sparse"] -= float(token_logprobs(sp, tgt[s:e]).sum())
        out["kl"] += float(kl_per_position(d, sp).sum())
        out["top1"] += float((d.argmax(-1) == sp.argmax(-1)).sum())
    return out


@dataclass
class Cell:
    """Running sums of one grid cell."""

    task: str
    source: str
    length: int
    method: str
    density: float
    config: dict
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)
    items: list[dict] = field(default_factory=list)

    def add(self, item: Item, dense: Pass, sparse: Pass) -> None:
        dd, sd = dense.decoded, sparse.decoded
        s = lm_sums(dd.prompt_hidden, sd.prompt_hidden, item.ids[0], dd.logits)
        s["dense_ms"], s["sparse_ms"] = dense.ms, sparse.ms
        s.update(stage_sums(dense, sparse))
        s["tokens"] = float(item.ids.shape[1])
        detail = {"label": item.label, "tokens": item.ids.shape[1]}
        if item.answer is not None:
            dense_text, sparse_text = dense.text, sparse.text
            s["right_dense"] = float(is_correct(dense_text, item.answer))
            s["right_sparse"] = float(is_correct(sparse_text, item.answer))
            detail.update(answer=item.answer, dense=dense_text, sparse=sparse_text)
        for k, v in s.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        for phase, c in sparse.counts.items():
            acc = self.counts.setdefault(phase, [0, 0, 0, 0])
            for i, v in enumerate(c):
                acc[i] += v
        if s["n"] > 0:
            detail["kl"] = s["kl"] / s["n"]
        self.items.append(detail)

    def row(self, lm: LoadedModel, eval_id: str, phases: str) -> dict:
        s, n_items = self.sums, len(self.items)
        n = s.get("n", 0.0)
        answered = "right_dense" in s
        return {
            "eval_id": eval_id,
            "model_id": lm.model_id,
            "model_hash": lm.model_hash,
            "task": self.task,
            "source": self.source,
            "length": self.length,
            "method": self.method,
            "phases": phases,
            "density_target": self.density,
            "density_achieved": _ratio(self.counts.get("prefill"), 0),
            "density_achieved_all": _ratio(self.counts.get("prefill"), 2),
            "density_decode": _ratio(self.counts.get("decode"), 0),
            "n_items": n_items,
            "n_tokens": int(s.get("tokens", 0)),
            "ppl_dense": math.exp(s["nll_dense"] / n) if n else None,
            "ppl_sparse": math.exp(s["nll_sparse"] / n) if n else None,
            "kl_mean": s["kl"] / n if n else None,
            "top1_agreement": s["top1"] / n if n else None,
            "acc_dense": s["right_dense"] / n_items if answered else None,
            "acc_sparse": s["right_sparse"] / n_items if answered else None,
            "dense_ms": s.get("dense_ms", 0.0) / max(n_items, 1),
            "sparse_ms": s.get("sparse_ms", 0.0) / max(n_items, 1),
            "config": self.config,
            "extra": {
                "items": self.items,
                "device": str(lm.device),
                "versions": _versions(),
                "timings": {k: s.get(k, 0.0) / max(n_items, 1) for k in TIMING_KEYS},
            },
        }


TIMING_KEYS = ("dense_attention_ms", "sparse_attention_ms", "selection_ms")


def stage_sums(dense: Pass, sparse: Pass) -> dict[str, float]:
    """The dense model's attention ms, the sparse pass's attention ms and its selection ms (every
    other stage: sketch and estimate, walk, select), so a cell shows what its selection costs."""
    return {
        "dense_attention_ms": dense.stages.get("attention", 0.0),
        "sparse_attention_ms": sparse.stages.get("attention", 0.0),
        "selection_ms": selection_ms(sparse.stages),
    }


def _ratio(c: list[int] | None, at: int) -> float | None:
    if not c or not c[at + 1]:
        return None
    return c[at] / c[at + 1]


def _versions() -> dict[str, str]:
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sketchwalk": sketchwalk.__version__,
    }


@dataclass(frozen=True)
class GridSpec:
    methods: tuple[str, ...]
    densities: tuple[float, ...]
    phases: str = "both"
    new_tokens: int = 8  # greedy tokens for items with an answer (0 for pure LM items)
    base: dict = field(default_factory=dict)  # other SketchWalkConfig knobs
    kernel_backend: str | None = None
    # knob overrides crossed with methods x densities (the frontier: block sizes, granularity)
    variants: tuple[dict, ...] = ({},)


def configs(spec: GridSpec) -> list[SketchWalkConfig]:
    """One validated config per (variant, method, density); bad knobs fail before model work."""
    if "dense" in spec.methods:
        raise SketchWalkError(
            "dense is the reference every row is compared with; not a method here"
        )
    return [
        SketchWalkConfig(**{**spec.base, **v, "method": m, "density": d, "phases": spec.phases})
        for v in spec.variants
        for m in spec.methods
        for d in spec.densities
    ]


def run_grid(
    lm: LoadedModel,
    items: list[Item],
    spec: GridSpec,
    eval_id: str,
    progress: Progress | None = None,
) -> list[dict]:
    """Rows (one per cell, in task/source/length/method/density order) ready for the store."""
    cfgs = configs(spec)
    biggest = max(c.block_size for c in cfgs)
    for item in items:
        if item.ids.shape[1] < 2 * biggest:
            raise SketchWalkError(
                f"item {item.label} has {item.ids.shape[1]} tokens; an eval needs at least two "
                f"blocks ({2 * biggest} tokens)"
            )
        limit = lm.max_context - (spec.new_tokens if item.answer is not None else 0)
        if item.ids.shape[1] > limit:
            raise SketchWalkError(
                f"item {item.label} has {item.ids.shape[1]} tokens, more than {lm.model_id}'s "
                f"context allows ({limit}); use shorter --lengths"
            )
    cells: dict[tuple, Cell] = {}
    total, done = len(items) * (1 + len(cfgs)), 0

    def tick(msg: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / total, msg)

    for item in items:
        new = spec.new_tokens if item.answer is not None else 0
        dense = dense_pass(lm, item.ids, new)
        tick(f"{item.label} dense")
        for cfg in cfgs:
            key = (item.task, item.source, item.length, cfg.method, cfg.density)
            cell_key = (*key, cfg.block_size, cfg.per_group, json.dumps(cfg.to_dict()))
            if cell_key not in cells:
                cells[cell_key] = Cell(*key, config=cfg.to_dict())
            key = cell_key
            sparse = sparse_pass(lm, item.ids, cfg, new, spec.kernel_backend)
            cells[key].add(item, dense, sparse)
            del sparse
            tick(f"{item.label} {cfg.method}@{cfg.density:g}")
        del dense
    return [c.row(lm, eval_id, spec.phases) for c in cells.values()]

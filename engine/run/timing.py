"""Clean timings of a whole-model pass: prefill and decode with no recorder, attention alone.

Why a module of its own: the recorder (engine/run/recorder.py) copies per-layer tensors to the CPU and
times dense attention a second time, so the times of a recorded run are not what a user gets in
their own code. A clean pass (no recorder, the last logits only, as model.generate computes them)
is what `sketchwalk bench model` times repeatedly, and what a run adds to its summary when asked
(runner.RunOptions.clean_timing): the ratio a user would get, beside the recording overhead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from sketchwalk.engine.clock import now_ms, timed
from sketchwalk.engine.hf.cache import cache_kwarg, new_cache
from sketchwalk.engine.hf.hook import NAME
from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig

TIMED_SDPA = "sdpa_timed"
_dense_attention_ms = [0.0]  # the timed SDPA's running total (one benchmark at a time)
_dense_layer_ms: dict[int, float] = {}  # and per layer (the module's layer_idx)


@dataclass
class Pass:
    """One prefill + decode of one variant."""

    prefill_ms: float
    decode_ms: list[float]  # per token
    stages: dict[str, float]  # prefill_<stage> totals, decode_<stage> per token (ms)
    first_token: int
    layers: dict[int, float] = field(default_factory=dict)  # dense: prefill attention per layer


def last_logits_only(model: torch.nn.Module) -> dict:
    """Forward kwargs that skip the LM head on every position but the last, where supported."""
    params = inspect.signature(model.forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


# inference_mode, not no_grad: no version counters or view records on a sparse decode step's
# many small ops (2048 tokens: ~55 -> ~51 ms a step; dense ~1% faster)
@torch.inference_mode()
def one_pass(
    model: torch.nn.Module,
    ids: torch.Tensor,
    new_tokens: int,
    all_logits: bool,
    after_prefill: Callable[[], None] | None = None,
) -> tuple[float, list[float], int]:
    """Prefill then greedy decode; returns prefill ms, per-token decode ms, the first new token."""
    kw = cache_kwarg(model)
    start = new_cache(model)
    keep = {} if all_logits else last_logits_only(model)
    dev = ids.device
    t0 = now_ms(dev)
    out = model(ids, use_cache=True, **keep, **start)
    nxt = int(out.logits[0, -1].argmax())
    prefill = now_ms(dev) - t0
    first = nxt
    if after_prefill is not None:
        after_prefill()
    cache = getattr(out, "cache", None) or out.past_key_values
    steps: list[float] = []
    for _ in range(new_tokens):
        t0 = now_ms(dev)
        out = model(torch.tensor([[nxt]], device=dev), use_cache=True, **{kw: cache})
        cache = getattr(out, "cache", None) or out.past_key_values
        nxt = int(out.logits[0, -1].argmax())
        steps.append(now_ms(dev) - t0)
    return prefill, steps, first


def _timed_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' own SDPA attention, timed: the dense model's attention alone."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, ms = timed(
        lambda: sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs),
        query.device,
    )
    _dense_attention_ms[0] += ms
    layer = getattr(module, "layer_idx", None)
    if isinstance(layer, int):
        _dense_layer_ms[layer] = _dense_layer_ms.get(layer, 0.0) + ms
    return out


def register_timed_sdpa() -> str:
    """Registers the timed dense attention (same kernel and masks as "sdpa"); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TIMED_SDPA, _timed_sdpa)
    AttentionMaskInterface.register(TIMED_SDPA, sdpa_mask)
    return TIMED_SDPA


@contextmanager
def timed_dense(model: torch.nn.Module) -> Iterator[Callable[[], float]]:
    """The model on its own SDPA, timed, inside the block; yields a reader of the dense attention
    ms spent since entry (the model is back on plain SDPA after, whatever happens)."""
    model.set_attn_implementation(register_timed_sdpa())
    start = _dense_attention_ms[0]
    try:
        yield lambda: _dense_attention_ms[0] - start
    finally:
        model.set_attn_implementation("sdpa")


def run_variant(
    model: torch.nn.Module,
    ids: torch.Tensor,
    new_tokens: int,
    cfg: SketchWalkConfig | None,
    all_logits: bool,
    backend: str | None = None,
) -> Pass:
    """cfg None: the model's own SDPA; else Sketch&Walk with no recorder."""
    if cfg is None:
        pre: list[float] = []
        _dense_layer_ms.clear()
        layers: dict[int, float] = {}

        def after_prefill() -> None:
            pre.append(attention_ms())
            layers.update(_dense_layer_ms)

        with timed_dense(model) as attention_ms:
            prefill, steps, first = one_pass(model, ids, new_tokens, all_logits, after_prefill)
            total = attention_ms()
        stages = {"prefill_attention": pre[0]}
        if new_tokens:
            stages["decode_attention"] = (total - pre[0]) / new_tokens
        return Pass(prefill, steps, stages, first, layers)
    model.set_attn_implementation(NAME)
    try:
        with sketch_walk_session(cfg, kernel_backend=backend) as session:
            pre: dict[str, float] = {}
            prefill, steps, first = one_pass(
                model, ids, new_tokens, all_logits, lambda: pre.update(session.timings)
            )
            # per-stage totals: prefill, and decode per token
            stages = {f"prefill_{k}": v for k, v in pre.items()}
            for k, v in session.timings.items():
                if new_tokens:
                    stages[f"decode_{k}"] = (v - pre.get(k, 0.0)) / new_tokens
    finally:
        model.set_attn_implementation("sdpa")
    return Pass(prefill, steps, stages, first)


def selection_ms(stages: dict[str, float], prefix: str = "") -> float:
    """Selection time among a pass's timed stages (those named prefix + stage): every stage but
    attention, i.e. the sketch with its block estimate, the walk and the select."""
    return sum(v for k, v in stages.items() if k.startswith(prefix) and k != f"{prefix}attention")


def clean_timings(
    model: torch.nn.Module,
    ids: torch.Tensor,
    cfg: SketchWalkConfig,
    new_tokens: int,
    backend: str | None = None,
    steps: dict[str, list[float]] | None = None,
    layers: dict[int, list[float]] | None = None,
) -> dict[str, float]:
    """One clean dense pass and one clean sparse pass (no recorder): the `clean_*` timing keys.

    Whole model and attention alone, prefill (ms) and decode (ms per token); one pass each, so
    as noisy as the run itself (`sketchwalk bench model` repeats and takes medians). `steps`,
    when given, receives each variant's per-token decode times ("dense", "sparse"); `layers`,
    the dense pass's prefill attention time of each layer (appended to its list).
    """
    dense = run_variant(model, ids, new_tokens, None, False)
    sparse = run_variant(model, ids, new_tokens, cfg, False, backend)
    if steps is not None:
        steps.update(dense=list(dense.decode_ms), sparse=list(sparse.decode_ms))
    if layers is not None:
        for layer, ms in dense.layers.items():
            layers.setdefault(layer, []).append(ms)
    out = {
        "clean_dense_prefill_ms": dense.prefill_ms,
        "clean_sparse_prefill_ms": sparse.prefill_ms,
        "clean_dense_attention_ms": dense.stages["prefill_attention"],
        "clean_sparse_attention_ms": sparse.stages.get("prefill_attention", 0.0),
    }
    out["clean_sparse_selection_ms"] = selection_ms(sparse.stages, "prefill_")
    if new_tokens and dense.decode_ms and sparse.decode_ms:
        # the mean step: steps that re-select (one per key block) cost more than the others
        out["clean_dense_decode_ms_per_token"] = sum(dense.decode_ms) / len(dense.decode_ms)
        out["clean_sparse_decode_ms_per_token"] = sum(sparse.decode_ms) / len(sparse.decode_ms)
        out["clean_dense_decode_attention_ms"] = dense.stages["decode_attention"]
        out["clean_sparse_decode_attention_ms"] = sparse.stages.get("decode_attention", 0.0)
        out["clean_sparse_decode_selection_ms"] = selection_ms(sparse.stages, "decode_")
    return out


def recording_overhead(timings: dict[str, float]) -> dict[str, float]:
    """What recording added: the recorded sparse pass minus the clean one (when both exist)."""
    out = {}
    rec, clean = timings.get("sparse_prefill_ms"), timings.get("clean_sparse_prefill_ms")
    if rec is not None and clean is not None:
        out["recording_overhead_prefill_ms"] = rec - clean
    rec = timings.get("sparse_decode_ms_per_token")
    clean = timings.get("clean_sparse_decode_ms_per_token")
    if rec is not None and clean is not None:
        out["recording_overhead_decode_ms_per_token"] = rec - clean
    return out

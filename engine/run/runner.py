"""The runner: one prompt through the dense model and the sparse one, compared.

Each variant does one prefill over the prompt (whose final hidden states give the teacher-forced
metrics) and then greedy decoding from the same cache, so the sparse prefill that is measured is
the one that feeds sparse decode.

Memory: the model body runs without its LM head, and the head is applied to a chunk of positions
at a time when the metrics need logits (`LMParts`), so full-vocabulary logits never exist for the
whole prompt (32k positions x 49k vocabulary would be 6.4 GB per copy). A run reports its peak
resident memory in its timings (`peak_rss_mb`).
"""

from __future__ import annotations

import contextlib
import hashlib
import statistics
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import torch

import sketchwalk
from sketchwalk.engine.clock import now_ms, timed
from sketchwalk.engine.hf.cache import cache_kwarg, new_cache
from sketchwalk.engine.hf.hook import NAME
from sketchwalk.engine.hf.session import dense_context, sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.walk import COUNTERFACTUAL_BETA
from sketchwalk.engine.run.alongside import Alongside, Handoff, Stream, spare_core
from sketchwalk.engine.run.memory import PeakMemory
from sketchwalk.engine.run.metrics import (
    PromptComparison,
    common_prefix,
    compare_prompt_chunked,
    kl_per_position,
    perplexity,
    prompt_logprobs_into,
    token_logprobs,
)
from sketchwalk.engine.run.models import LoadedModel
from sketchwalk.engine.run.recorder import QueryLayer, QueryProbe, Recorder, RecorderOptions
from sketchwalk.engine.run.records import BlockSpan, RunResult, TokenRecord
from sketchwalk.machine import run_fields
from sketchwalk.progress import Progress


class PromptError(sketchwalk.errors.SketchWalkError):
    pass


@dataclass
class Decoded:
    prompt_hidden: torch.Tensor  # [T, H] final hidden states on CPU; logits via `logits`
    new_ids: list[int]
    new_logits: torch.Tensor  # [N, V]
    prefill_ms: float
    decode_ms: float
    logits: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.float  # hidden rows -> logits
    cache: object | None = None  # the KV cache after decoding, when asked to keep it


@dataclass
class RunOptions:
    max_new_tokens: int = 32
    record: bool = True
    recorder: RecorderOptions = field(default_factory=RecorderOptions)
    kernel_backend: str | None = None
    max_prompt_tokens: int | None = None  # None: the model's context
    # also time clean dense and sparse passes (no recorder): engine/run/timing.py
    clean_timing: bool = False
    # clean passes: timings are their medians, speed-ups carry the range over the passes
    clean_repeats: int = 3


def tokenize(lm: LoadedModel, prompt: str) -> torch.Tensor:
    ids = lm.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    return ids.to(lm.device)


def validate_prompt(
    n_tokens: int, lm: LoadedModel, cfg: SketchWalkConfig, opts: RunOptions
) -> None:
    limit = min(lm.max_context, opts.max_prompt_tokens or lm.max_context)
    if n_tokens == 0:
        raise PromptError("the prompt is empty")
    if n_tokens + opts.max_new_tokens > limit:
        raise PromptError(
            f"the prompt has {n_tokens} tokens; with {opts.max_new_tokens} new tokens that exceeds "
            f"the limit of {limit} tokens for {lm.model_id}"
        )


@dataclass
class LMParts:
    """A causal LM split into its body (final hidden states) and its head (hidden -> logits).

    Models without a separable head run whole: their 'hidden states' are then the logits and
    the head is the identity, so every caller works either way (only the memory saving is lost).
    """

    body: torch.nn.Module
    head: torch.nn.Module | None
    softcap: float | None = None

    @classmethod
    def of(cls, model: torch.nn.Module) -> LMParts:
        prefix = getattr(model, "base_model_prefix", "")
        body = getattr(model, prefix, None) if prefix else None
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if not isinstance(body, torch.nn.Module) or body is model or head is None:
            return cls(model, None)
        cap = getattr(model.config, "final_logit_softcapping", None)
        return cls(body, head, float(cap) if cap else None)

    def hidden(self, out: object) -> torch.Tensor:
        return out.logits if self.head is None else out.last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for a few positions' hidden states (on the head's device)."""
        if self.head is None:
            return hidden.float()
        w = self.head.weight
        out = self.head(hidden.to(device=w.device, dtype=w.dtype)).float()
        if self.softcap:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    def forward_hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states [T, H] of a whole sequence, no cache (the judge pass)."""
        return self.hidden(self.body(ids, use_cache=False))[0].cpu()


# inference_mode, not no_grad: no version counters or view records on a sparse decode step's
# many small ops (2048 tokens: ~55 -> ~51 ms a step; dense ~1% faster)
@torch.inference_mode()
def greedy(
    model: torch.nn.Module,
    ids: torch.Tensor,
    max_new: int,
    eos: int | None,
    on_token: Callable[[int], None] | None = None,
    keep_cache: bool = False,
    on_prefill: Callable[[torch.Tensor], None] | None = None,
) -> Decoded:
    """Prefill the prompt, then greedy-decode from the cache, keeping every step's logits.

    The prompt's logits are not kept: its final hidden states are (handed to `on_prefill` as
    soon as they exist), and the metrics apply the head to them a chunk of positions at a time.
    """
    parts = LMParts.of(model)
    kw = cache_kwarg(parts.body)
    start = new_cache(parts.body)
    out, prefill_ms = timed(lambda: parts.body(ids, use_cache=True, **start), ids.device)
    cache = getattr(out, "cache", None) or out.past_key_values
    hidden = parts.hidden(out)[0]
    prompt_hidden = hidden.cpu()
    logits = parts.logits(hidden[-1:])[0]
    del out, hidden
    if on_prefill is not None:
        on_prefill(prompt_hidden)
    new_ids: list[int] = []
    new_logits: list[torch.Tensor] = []
    t0 = now_ms(ids.device)
    for i in range(max_new):
        nxt = int(logits.argmax())
        new_ids.append(nxt)
        new_logits.append(logits.cpu())
        if on_token is not None:
            on_token(i + 1)
        if nxt == eos or i == max_new - 1:
            break
        out = parts.body(torch.tensor([[nxt]], device=ids.device), use_cache=True, **{kw: cache})
        cache = getattr(out, "cache", None) or out.past_key_values
        logits = parts.logits(parts.hidden(out)[0, -1:])[0]
    decode_ms = now_ms(ids.device) - t0
    v = logits.shape[-1]
    stacked = torch.stack(new_logits) if new_logits else torch.empty(0, v)
    kept = cache if keep_cache else None
    return Decoded(prompt_hidden, new_ids, stacked, prefill_ms, decode_ms, parts.logits, kept)


def _dense_greedy(
    model: torch.nn.Module,
    ids: torch.Tensor,
    max_new: int,
    eos: int | None,
    on_token: Callable[[int], None],
) -> Decoded:
    """The dense side's greedy pass, its cache kept for the judge (up to JUDGE_CACHE_MB). The
    model may be on either implementation: under "sketch_walk" this context is dense."""
    with dense_context():
        dense = greedy(model, ids, max_new, eos, on_token, keep_cache=True)
    if dense.cache is not None and cache_mb(dense.cache) > JUDGE_CACHE_MB:
        dense.cache = None  # a long prompt: the judge runs whole, memory stays as it was
    return dense


def _dense_side(
    model: torch.nn.Module,
    parts: LMParts,
    ids: torch.Tensor,
    max_new: int,
    eos: int | None,
    on_token: Callable[[int], None],
    sparse_prompt: Handoff[torch.Tensor],
) -> tuple[Decoded, torch.Tensor | None, PromptComparison]:
    """A new prompt's dense side whole, for the spare core: its greedy pass, its prompt
    log-probabilities (the memo's; None past DENSE_LOGPROBS_MB) and, once the sparse prefill
    hands over its prompt states, the prompt comparison."""
    dense = _dense_greedy(model, ids, max_new, eos, on_token)
    logprobs = dense_logprobs_buffer(parts, ids.shape[1], judge_vocab(dense))
    if logprobs is not None:
        with torch.inference_mode():
            prompt_logprobs_into(logprobs, parts.logits, dense.prompt_hidden)
    hidden = sparse_prompt.wait(lambda: on_token(max_new))
    return dense, logprobs, _compare(parts, dense, hidden, ids, logprobs, None)


@torch.inference_mode()
def _compare(
    parts: LMParts,
    dense: Decoded,
    sparse_hidden: torch.Tensor,
    ids: torch.Tensor,
    known: torch.Tensor | None,
    keep: torch.Tensor | None,
) -> PromptComparison:
    """The prompt comparison: the dense log-probabilities `known` from an earlier run on the
    prompt, or computed (and written into `keep` for the next)."""
    return compare_prompt_chunked(
        parts.logits,
        dense.prompt_hidden,
        sparse_hidden,
        ids[0].cpu(),
        dense_logprobs=known,
        keep_dense=keep,
    )


@dataclass(frozen=True)
class DenseMemo:
    """The dense side of the last prompt run on a model (LoadedModel.dense_memo): its greedy pass
    (prompt hidden states, generation and its logits, timings, the KV cache for the judge) and
    the key that decides it. The dense model is deterministic given these, so a run at another
    density or with other knobs on the same prompt reuses it instead of a second dense pass
    (about a third of a 2k-token run). The clean timing passes never reuse it: speed stays
    measured side by side."""

    key: tuple
    dense: Decoded
    # the prompt comparison's dense log-probabilities [T - 1, V] (kept up to DENSE_LOGPROBS_MB):
    # the next comparison on the prompt runs the head and log-softmax of its sparse side only
    prompt_logprobs: torch.Tensor | None = None


def dense_key(ids: torch.Tensor, max_new: int, eos: int | None, model: torch.nn.Module) -> tuple:
    """What decides a prompt's dense side: its token ids, the new tokens asked, the stop token,
    and the model object with its dtype, device and attention (the memo lives on the model)."""
    digest = hashlib.sha256(ids.detach().cpu().numpy().tobytes()).hexdigest()
    p = next(model.parameters())
    return (digest, tuple(ids.shape), max_new, eos, id(model), str(p.dtype), str(p.device))


JUDGE_CACHE_MB = 512
"""The dense judge reuses the dense pass's KV cache (cropped to the prompt) when it is at most
this big: the sparse continuation then costs a forward over its few tokens instead of the whole
prompt again (a 2k-token SmolLM2 run: 94 MB kept through the sparse pass, one prefill saved).
Longer prompts run the judge as a whole forward, so the cache is never held beside the
sparse pass where it would matter for memory."""


def cache_mb(cache: object) -> float:
    """Bytes held by a KV cache's keys and values (its layers' tensors), in MiB."""
    layers = getattr(cache, "layers", None) or []
    total = 0
    for layer in layers:
        for name in ("keys", "values", "_kbuf", "_vbuf"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total / 2**20


DENSE_LOGPROBS_MB = 512
"""The dense side of the prompt comparison (its log-probabilities, positions x vocabulary in
float32) is kept in the dense memo when it is at most this big (a 2k-token SmolLM2 prompt:
365 MB, about 40% of a comparison saved at the next density); longer prompts recompute it."""


def dense_logprobs_buffer(parts: LMParts, n: int, vocab: int) -> torch.Tensor | None:
    """Where a first comparison on an n-token prompt writes its dense log-probabilities for the
    memo, on the head's device; None past DENSE_LOGPROBS_MB (or for a prompt of one token)."""
    if n < 2 or (n - 1) * vocab * 4 > DENSE_LOGPROBS_MB * 2**20:
        return None
    device = parts.head.weight.device if parts.head is not None else torch.device("cpu")
    return torch.empty(n - 1, vocab, device=device)


@torch.inference_mode()
def judge_logits(
    parts: LMParts, ids: torch.Tensor, dense: Decoded, new_ids: list[int]
) -> torch.Tensor:
    """Dense next-token logits along a continuation `new_ids` of the prompt `ids`: row i is the
    dense model's distribution for new_ids[i] given the prompt and new_ids[:i]. From the dense
    pass's kept cache when there is one (cropped back to the prompt before and after, so the
    next run on the prompt can use it again), else a whole forward."""
    n = ids.shape[1]
    if not new_ids:
        return torch.empty(0, dense.new_logits.shape[-1])
    cache = dense.cache
    extra = cache.get_seq_length() - n if cache is not None else -1
    if cache is not None and extra >= 0:
        if extra:
            cache.crop(-extra)  # back to the prompt (transformers 5: a negative count to remove)
        kw = cache_kwarg(parts.body)
        rows = [dense.new_logits[:1].float()]  # the prompt's last position: the dense pass's
        if len(new_ids) > 1:
            chunk = torch.tensor([new_ids[:-1]], dtype=torch.long, device=ids.device)
            out = parts.body(chunk, use_cache=True, **{kw: cache})
            rows.append(parts.logits(parts.hidden(out)[0]).cpu())
            cache.crop(-(len(new_ids) - 1))  # the prompt's again, for the next run on it
        return torch.cat(rows)
    seq = torch.cat([ids[0].cpu(), torch.tensor(new_ids, dtype=torch.long)])
    hidden = parts.forward_hidden(seq[None].to(ids.device))
    return parts.logits(hidden[n - 1 : n - 1 + len(new_ids)]).cpu()


def judge_vocab(dense: Decoded) -> int:
    """The vocabulary of the model's logits (the dense pass kept a [N, V] tensor, N may be 0)."""
    return int(dense.new_logits.shape[-1])


def _versions(device: torch.device) -> dict[str, str]:
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sketchwalk": sketchwalk.__version__,
        **run_fields(device),  # the machine: timings from two CPUs are not comparable
    }


def block_spans(
    tokenizer, ids: list[int], block_size: int, max_chars: int = 240
) -> list[BlockSpan]:
    spans = []
    for b, s in enumerate(range(0, len(ids), block_size)):
        e = min(len(ids), s + block_size)
        text = tokenizer.decode(ids[s:e])
        spans.append(
            BlockSpan(b, s, e, text if len(text) <= max_chars else text[: max_chars - 1] + "…")
        )
    return spans


def run(
    lm: LoadedModel,
    prompt: str,
    cfg: SketchWalkConfig,
    opts: RunOptions | None = None,
    progress: Progress | None = None,
    speed: bool = True,
) -> RunResult:
    """Dense and sparse on the same prompt: generations, metrics, per-layer records, timings.

    speed False: the quality half only (no clean passes, whatever opts says, and no per-layer
    dense timing in the recorder); the caller that shows quality first then calls
    `speed_timings` for the rest, which times each layer's dense attention in its clean dense
    passes instead (`layer_dense`)."""
    opts = opts or RunOptions()
    ids = tokenize(lm, prompt)
    validate_prompt(ids.shape[1], lm, cfg, opts)
    with PeakMemory(lm.device) as peak:
        result = _run(lm, prompt, ids, cfg, opts, progress, speed)
    result.timings.update(peak.as_dict())
    return result


def speed_timings(
    lm: LoadedModel,
    prompt: str,
    cfg: SketchWalkConfig,
    opts: RunOptions,
    recorded: dict[str, float],
    progress: Progress | None = None,
    layer_dense: dict[int, float] | None = None,
) -> dict[str, float]:
    """The speed half of a run whose quality half came first (run(..., speed=False)): its clean
    passes, dense and sparse side by side (never a reused dense side), and what recording added
    to the `recorded` timings. Empty when opts asks for no clean timing. `layer_dense`, when
    given, receives each layer's dense prefill attention time (ms, the median over the clean
    dense passes): the per-layer dense timing the quality half left out (LayerRecord.t_dense_ms
    of its sparse prefill layers, see with_layer_dense)."""
    ids = tokenize(lm, prompt)
    repeats = max(1, opts.clean_repeats)

    def on_pass(i: int) -> None:
        if progress is not None:
            progress(i / repeats, f"timing clean pass {i + 1}/{repeats}")

    return _clean_timings(lm, ids, cfg, opts, recorded, on_pass, layer_dense)


def with_layer_dense(layers: list, layer_dense: dict[int, float]) -> int:
    """Each sparse prefill record (not its groups') without a dense time takes its layer's from
    the speed half (speed_timings' layer_dense); returns how many did."""
    done = 0
    for rec in layers:
        if rec.phase == "prefill" and not rec.dense and rec.t_dense_ms is None:
            ms = layer_dense.get(rec.layer)
            if ms is not None:
                rec.t_dense_ms = float(ms)
                done += 1
    return done


def _run(
    lm: LoadedModel,
    prompt: str,
    ids: torch.Tensor,
    cfg: SketchWalkConfig,
    opts: RunOptions,
    progress: Progress | None,
    speed: bool = True,
) -> RunResult:
    n = ids.shape[1]
    model, tok = lm.model, lm.tokenizer
    eos = tok.eos_token_id
    n_layers = int(model.config.num_hidden_layers)
    passes = 2 * (1 + opts.max_new_tokens)
    repeats = max(1, opts.clean_repeats) if opts.clean_timing and speed else 0
    total = passes + (passes // 2) * repeats  # a clean pass: ~ a third of the recorded ones

    def report(done: float, msg: str) -> None:
        if progress is not None:
            progress(min(done / total, 1.0), msg)

    key = dense_key(ids, opts.max_new_tokens, eos, model)
    memo, lm.dense_memo = lm.dense_memo, None  # a failed run leaves no memo behind
    reused = isinstance(memo, DenseMemo) and memo.key == key
    known = memo.prompt_logprobs if reused else None
    # the quality half times nothing side by side: its independent work goes to the spare core
    alongside = not speed and spare_core(lm.device)
    parts = LMParts.of(model)
    dense_side: Alongside[tuple[Decoded, torch.Tensor | None, PromptComparison]] | None = None
    sparse_prompt: Handoff[torch.Tensor] = Handoff()  # the sparse prefill's, for the dense side
    if reused:
        dense = memo.dense
        report(1 + opts.max_new_tokens, "dense side of this prompt reused")
    elif alongside:
        model.set_attn_implementation(NAME)  # dense_context() makes that thread's calls SDPA
        dense_side = Alongside(
            lambda tick: _dense_side(
                model, parts, ids, opts.max_new_tokens, eos, tick, sparse_prompt
            ),
            "sketchwalk-dense-side",
        )
    else:
        model.set_attn_implementation("sdpa")
        report(0, "dense prefill")
        dense = _dense_greedy(
            model, ids, opts.max_new_tokens, eos, lambda i: report(1 + i, f"dense token {i}")
        )

    # the quality half times no dense attention per layer: the speed half's clean dense
    # passes do, beside the clean sparse ones (a recorded 2k-token run: ~3 s of dense SDPA)
    rec_opts = opts.recorder if speed else replace(opts.recorder, time_dense=False)
    recorder = Recorder(rec_opts) if opts.record else None
    stream: Stream | None = None
    compared: list[Future[PromptComparison]] = []
    running = contextlib.ExitStack()  # the second stream's work: stopped if this side fails

    def dense_done() -> int:
        return dense_side.done if dense_side is not None else 1 + opts.max_new_tokens

    def on_layer(phase: str, step: int, layer: int) -> None:
        base = dense_done() + (step if phase == "decode" else 0)
        report(base + layer / n_layers, f"sparse {phase} step {step} layer {layer}")

    def on_prefill(hidden: torch.Tensor) -> None:
        if dense_side is not None:  # a new prompt: its dense side compares once it is done
            sparse_prompt.put(hidden)
        elif stream is not None and known is not None:  # only the sparse side's head is left
            compared.append(stream.put(lambda: _compare(parts, dense, hidden, ids, known, None)))

    model.set_attn_implementation(NAME)
    try:
        with running:
            if dense_side is not None:
                running.enter_context(dense_side)
            elif alongside:  # a known prompt leaves the spare core to the recorder's exact
                # mass and metrics, in order, and to the comparison once the prefill is done
                stream = running.enter_context(Stream("sketchwalk-second-stream"))
                if recorder is not None:
                    recorder.later = stream.put
            with sketch_walk_session(cfg, recorder, on_layer, opts.kernel_backend) as session:
                sparse = greedy(model, ids, opts.max_new_tokens, eos, on_prefill=on_prefill)
            if dense_side is not None:
                report(passes - 1, "waiting for the dense side")
                dense, known, comparison = dense_side.result()
        if dense_side is None:
            comparison = compared[0].result() if compared else None
    finally:
        model.set_attn_implementation("sdpa")

    # dense judge of the sparse continuation: per-token KL and likelihood of what sparse wrote
    report(passes, "comparing")
    seq = torch.cat([ids[0].cpu(), torch.tensor(sparse.new_ids, dtype=torch.long)])
    judge = judge_logits(parts, ids, dense, sparse.new_ids)
    gen_kl = kl_per_position(judge, sparse.new_logits)
    sparse_by_dense = token_logprobs(judge, seq[n:])

    ids_list = ids[0].tolist()
    if comparison is None:
        keep = None if known is not None else dense_logprobs_buffer(parts, n, judge_vocab(dense))
        comparison = _compare(parts, dense, sparse.prompt_hidden, ids, known, keep)
        known = known if known is not None else keep
    # the next density on this prompt starts here
    lm.dense_memo = DenseMemo(key, dense, known)
    metrics = comparison.summary()
    metrics.update(
        gen_kl_mean=float(gen_kl.mean()) if gen_kl.numel() else None,
        gen_common_prefix=common_prefix(dense.new_ids, sparse.new_ids),
        ppl_gen_dense=perplexity(token_logprobs(dense.new_logits, torch.tensor(dense.new_ids))),
        ppl_gen_sparse_by_dense=perplexity(sparse_by_dense),
        density_target=cfg.density if cfg.method != "dense" else 1.0,
        density_achieved=session.density("prefill"),
        density_achieved_all=session.density("prefill", sparse_only=False),
        density_decode=session.density("decode"),
        # the layer profile's densities per layer and group this run selected with (None: the
        # target everywhere), so a stored run says how its budget was spread
        layer_densities={str(k): list(v) for k, v in session.layer_density.items()}
        if session.layer_density
        else None,
        walk_effect=summarise_walk_effect(recorder.walk_effect, cfg) if recorder else None,
        dense_reused=reused,
    )
    timings = {f"{k}_ms": v for k, v in session.timings.items()}
    timings.update(
        dense_prefill_ms=dense.prefill_ms,
        sparse_prefill_ms=sparse.prefill_ms,
        dense_decode_ms_per_token=dense.decode_ms / max(len(dense.new_ids) - 1, 1),
        sparse_decode_ms_per_token=sparse.decode_ms / max(len(sparse.new_ids) - 1, 1),
    )
    if speed:
        timings.update(
            _clean_timings(
                lm,
                ids,
                cfg,
                opts,
                timings,
                lambda i: report(
                    passes + (passes // 2) * i, f"timing clean pass {i + 1}/{repeats}"
                ),
            )
        )
    if recorder is not None:
        prefill = [r for r in recorder.layers if r.phase == "prefill"]
        if prefill and all(r.t_dense_ms is not None for r in prefill):
            timings["dense_attention_ms"] = float(sum(r.t_dense_ms for r in prefill))

    tokens = _token_records(tok, ids_list, dense, sparse, comparison, gen_kl)
    return RunResult(
        model_id=lm.model_id,
        model_hash=lm.model_hash,
        prompt=prompt,
        prompt_tokens=n,
        method=cfg.method,
        config=cfg.to_dict(),
        device=str(lm.device),
        versions=_versions(lm.device),
        dense_text=tok.decode(dense.new_ids, skip_special_tokens=True),
        sparse_text=tok.decode(sparse.new_ids, skip_special_tokens=True),
        metrics=metrics,
        timings=timings,
        layers=recorder.layers + recorder.group_layers if recorder is not None else [],
        blocks=block_spans(tok, ids_list + sparse.new_ids, cfg.block_size),
        tokens=tokens,
    )


def summarise_walk_effect(per_layer: list[dict], cfg: SketchWalkConfig) -> dict | None:
    """A recorded run's walk, in the verdict's words: whether it selected (used) or was the
    counterfactual at COUNTERFACTUAL_BETA, its damping, and over the prefill's sparse layers the
    blocks its selection adds and drops against A_l's alone, the exact mass it gains per query
    block row summed over layers (None without exact mass), and each layer's numbers."""
    if not per_layer:
        return None
    used = bool(per_layer[0]["used"])
    gains = [x["mass_gain"] for x in per_layer if x["mass_gain"] is not None]
    return {
        "used": used,
        "beta": cfg.effective_beta if used else COUNTERFACTUAL_BETA,
        "added": sum(x["added"] for x in per_layer),
        "dropped": sum(x["dropped"] for x in per_layer),
        "mass_gain": float(sum(gains)) if gains else None,
        "layers": per_layer,
    }


def _clean_timings(
    lm: LoadedModel,
    ids: torch.Tensor,
    cfg: SketchWalkConfig,
    opts: RunOptions,
    timings: dict,
    on_pass: Callable[[int], None] | None = None,
    layer_dense: dict[int, float] | None = None,
) -> dict[str, float]:
    """Clean-pass timings beside the recorded ones (RunOptions.clean_timing), else nothing.

    `clean_repeats` clean prefills (dense and sparse each; the first pass also decodes every new
    token): each `clean_*` key is its median over the passes that measured it. The speed-ups
    carry their spread, so a verdict can tell a speed-up from the noise of a busy machine:
    prefill, the median and range of the passes' dense/sparse ratios; decode, the median and
    middle half of the per-token ratios (token i of the dense pass over token i of the sparse
    one: the same cache length), so decode needs no second pass.
    """
    if not opts.clean_timing:
        return {}
    from sketchwalk.engine.run.timing import clean_timings, recording_overhead

    runs, steps, layers = [], {}, {}
    for i in range(max(1, opts.clean_repeats)):
        if on_pass is not None:
            on_pass(i)
        new = opts.max_new_tokens if i == 0 else 0
        runs.append(
            clean_timings(
                lm.model,
                ids,
                cfg,
                new,
                opts.kernel_backend,
                steps=steps if i == 0 else None,
                layers=layers,
            )
        )
    if layer_dense is not None:
        layer_dense.update({k: statistics.median(v) for k, v in layers.items()})
    out = median_timings(runs)
    out.update(decode_spread(steps.get("dense", []), steps.get("sparse", [])))
    if opts.record:  # a run without the recorder has no recording overhead to report
        out.update(recording_overhead({**timings, **out}))
    return out


def median_timings(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each key's median over the passes that have it, and the prefill speed-up's median and
    range over the passes' dense/sparse ratios (`clean_prefill_speedup`, `_lo`, `_hi`)."""
    keys = sorted(set().union(*runs)) if runs else []
    out = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
    out["clean_repeats"] = len(runs)
    dense_key, sparse_key = "clean_dense_prefill_ms", "clean_sparse_prefill_ms"
    ratios = [
        r[dense_key] / r[sparse_key]
        for r in runs
        if r.get(dense_key) and r.get(sparse_key) and r[sparse_key] > 0
    ]
    if ratios:
        out["clean_prefill_speedup"] = statistics.median(ratios)
        out["clean_prefill_speedup_lo"] = min(ratios)
        out["clean_prefill_speedup_hi"] = max(ratios)
    return out


def decode_spread(dense_ms: list[float], sparse_ms: list[float]) -> dict[str, float]:
    """The decode speed-up from per-token times: the median of token i's dense/sparse ratios and
    their middle half (25th to 75th percentile), over the tokens both passes decoded."""
    ratios = [d / s for d, s in zip(dense_ms, sparse_ms, strict=False) if d > 0 and s > 0]
    if not ratios:
        return {}
    if len(ratios) == 1:
        lo = hi = ratios[0]
    else:
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        lo, hi = q[0], q[2]
    return {
        "clean_decode_speedup": statistics.median(ratios),
        "clean_decode_speedup_lo": lo,
        "clean_decode_speedup_hi": hi,
        "clean_decode_tokens": len(ratios),
    }


def _token_records(
    tok,
    ids: list[int],
    dense: Decoded,
    sparse: Decoded,
    cmp: PromptComparison,
    gen_kl: torch.Tensor,
) -> list[TokenRecord]:
    d_lp, s_lp, kl = cmp.logprob_dense.tolist(), cmp.logprob_sparse.tolist(), cmp.kl.tolist()
    texts = tok.convert_ids_to_tokens(ids)
    out: list[TokenRecord] = []
    for p, t in enumerate(ids):
        text = tok.convert_tokens_to_string([texts[p]])
        out.append(TokenRecord("dense", p, t, text, d_lp[p - 1] if p else None))
        out.append(
            TokenRecord("sparse", p, t, text, s_lp[p - 1] if p else None, kl[p - 1] if p else None)
        )
    n = len(ids)
    for variant, dec in (("dense", dense), ("sparse", sparse)):
        lps = (
            token_logprobs(dec.new_logits, torch.tensor(dec.new_ids)).tolist()
            if dec.new_ids
            else []
        )
        kls = gen_kl.tolist() if variant == "sparse" else [None] * len(dec.new_ids)
        for i, t in enumerate(dec.new_ids):
            out.append(TokenRecord(variant, n + i, t, tok.decode([t]), lps[i], kls[i]))
    return out


@torch.inference_mode()
def probe_queries(
    lm: LoadedModel,
    prompt: str,
    cfg: SketchWalkConfig,
    positions: list[int],
    top_k: int = 8,
    kernel_backend: str | None = None,
    progress: Progress | None = None,
) -> list[QueryLayer]:
    """The drill-down of a few prompt tokens, computed on demand: the run's sparse prefill again
    (same prompt, config and model, so the same selection), with a QueryProbe reading each
    layer's attention rows of those positions. Memory: heads x keys per position and layer.
    progress: told (fraction, "layer i of L") as each layer starts."""
    ids = tokenize(lm, prompt)
    n = ids.shape[1]
    bad = [p for p in positions if not 0 <= int(p) < n]
    if bad:
        raise PromptError(f"position {bad[0]} is not in the prompt (0 to {n - 1})")
    probe = QueryProbe(sorted({int(p) for p in positions}), top_k)
    model = lm.model
    layers = int(model.config.num_hidden_layers)

    def on_layer(phase: str, step: int, layer: int) -> None:
        if progress is not None:
            progress(layer / layers, f"layer {layer + 1} of {layers}")

    model.set_attn_implementation(NAME)
    try:
        with sketch_walk_session(cfg, probe, on_layer, kernel_backend):
            LMParts.of(model).body(ids, use_cache=False)
    finally:
        model.set_attn_implementation("sdpa")
    return probe.layers

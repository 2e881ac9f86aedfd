"""Per-sequence state of one forward/generate call, bound in a context variable.

The attention function is called layer by layer without any handle to "this run": the walk needs
the previous layer's scores and decode needs every layer's grown A_l. Binding that state to a
context (not to modules or globals) keeps two runs, threads or requests from ever sharing it.
What each call is (prefill, decode step, chunk) is read from the layer's cache at layer 0 into the
step's plan (engine/method/step.py), which every layer of the step reads; each phase has its own
path (_prefill, _decode, _chunk), and everything the recorder sees passes through one call
(Session._observe).
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch

from sketchwalk.engine.clock import Duration, Stopwatch, now_ms
from sketchwalk.engine.hf.dense import dense_attention, key_validity
from sketchwalk.engine.hf.threads import one_thread
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.decode import (
    DecodeLayerState,
    chunk_step,
    decode_reuse,
    decode_step,
    reusable,
    start_decode,
)
from sketchwalk.engine.method.layer_profile import layer_densities
from sketchwalk.engine.method.pipeline import LayerPlan, layer_exact, prefill_plan, sparse_attention
from sketchwalk.engine.method.sketch import SRHT, make_srht
from sketchwalk.engine.method.step import StepPlan
from sketchwalk.engine.run.recorder import LayerStep, Recorder
from sketchwalk.kernels import BlockLists, backend_for, use_backend

Exact = torch.Tensor | None  # a layer step's exact block mass, where it was computed
ExactLater = Callable[[], torch.Tensor] | None  # the recorder's, computed when it asks
Outcome = tuple[LayerPlan | None, torch.Tensor, Duration]  # a layer step's plan, output and its ms


@dataclass(frozen=True)
class LayerCall:
    """One layer's attention call as the hook hands it over, with what the session read off it:
    phase (prefill, decode or chunk, from the cache) and key_valid [B, Lk] (from the mask)."""

    phase: str
    layer: int
    q: torch.Tensor  # [B, H, Lq, d]
    k: torch.Tensor  # [B, Hkv, Lk, d], the cache's keys with the new ones
    v: torch.Tensor
    mask: torch.Tensor | None
    key_valid: torch.Tensor
    scale: float


# called as each layer starts, (phase, step, layer): where the sequence is, not a progress report
# (the runner turns it into one; see sketchwalk/progress.py)
LayerHook = Callable[[str, int, int], None]


@dataclass
class PairCounts:
    """Kept and causal block pairs of one phase, in the sparse layers and in all layers: ints,
    or 0-dim tensors a selection counted on its device (summed there, read once by density)."""

    kept: int | torch.Tensor = 0
    candidates: int | torch.Tensor = 0
    kept_all: int | torch.Tensor = 0
    candidates_all: int | torch.Tensor = 0

    def add(self, kept: int | torch.Tensor, cand: int | torch.Tensor, sparse: bool) -> None:
        if sparse:
            self.kept += kept
            self.candidates += cand
        self.kept_all += kept
        self.candidates_all += cand

    def density(self, sparse_only: bool = True) -> float | None:
        """Kept over causal pairs, in the sparse layers only or in all layers."""
        kept, cand = (
            (self.kept, self.candidates) if sparse_only else (self.kept_all, self.candidates_all)
        )
        kept, cand = float(kept), float(cand)
        return kept / cand if cand else None

    def __iter__(self):
        """(kept, candidates, kept_all, candidates_all): the tallies in a fixed order."""
        return iter((self.kept, self.candidates, self.kept_all, self.candidates_all))


@dataclass
class Session:
    cfg: SketchWalkConfig
    recorder: Recorder | None = None
    on_layer: LayerHook | None = None
    kernel_backend: str | None = None
    decode_reused: int = 0  # (layer, step) decode pairs that kept their last selection
    step: int = 0
    walk_prev: torch.Tensor | None = None
    walk_alt_prev: torch.Tensor | None = None  # a recorded run's counterfactual walk (pipeline)
    chunk_walk: torch.Tensor | None = None  # the current chunk's rows of the previous layer's walk
    decode_states: dict[int, DecodeLayerState] = field(default_factory=dict)
    srhts: dict[tuple[int, int, str], SRHT] = field(default_factory=dict)
    stage_ms: dict[str, Duration] = field(default_factory=dict)  # summed per stage (timings)
    plan: StepPlan | None = None  # what the current forward step's layers share (layer 0 builds)
    _plan_mask: torch.Tensor | None = None  # the model's mask the plan's validity was read from
    # kept (row, block) pairs and all causal pairs, per phase, over sparse layers / all layers
    counts: dict[str, PairCounts] = field(default_factory=dict)  # per phase (density())
    # each sparse layer's density from the model's layer profile ({}: cfg.density everywhere);
    # None until the attention hook binds the model (bind_model)
    layer_density: dict[int, tuple[float, ...]] | None = None
    _layer_cfgs: dict[int, SketchWalkConfig] = field(default_factory=dict)
    n_layers: int = 0  # the bound model's layers (0: unknown, sampled_depth does not apply)

    def bind_model(self, model_config: object) -> None:
        """Read the model's layer profile once (engine/method/layer_profile.py); the hook passes the
        attention module's config, the one handle to the model a layer call has."""
        if self.layer_density is None:
            self.layer_density = layer_densities(self.cfg, model_config)
            self.n_layers = int(getattr(model_config, "num_hidden_layers", 0) or 0)

    def reconfigure(self, cfg: SketchWalkConfig) -> None:
        """Run the steps to come under cfg (a copied session tried under several decode rules):
        the per-layer configs and the profile's densities are derived again from it, since a
        bound session keeps them (assigning `cfg` alone would leave the layers on the old one)."""
        self.cfg = cfg
        self._layer_cfgs.clear()
        self.layer_density = None  # the hook binds the model again at the next layer call

    def cfg_for(self, layer: int) -> SketchWalkConfig:
        """The config a layer selects with: cfg, at the layer's profile densities (one per
        selection group, `density` their mean) if it has them, with the estimator of its depth
        in the model (SketchWalkConfig.at_depth) and the estimate its method and the recorder
        need (SketchWalkConfig.for_estimate)."""
        c = self._layer_cfgs.get(layer)
        if c is None:
            c = self.cfg
            d = (self.layer_density or {}).get(layer)
            if d is not None:
                mean = min(sum(d) / len(d), 1.0)
                c = c.with_(density=mean, group_density=d if len(d) > 1 else ())
            c = c.at_depth(layer, self.n_layers).for_estimate(self.recorder is not None)
            if self.layer_density is not None:  # bound: the layer's config is final
                self._layer_cfgs[layer] = c
        return c

    def srht(self, layer: int, dim: int, device: torch.device) -> SRHT:
        key = (layer, dim, str(device))
        if key not in self.srhts:
            self.srhts[key] = make_srht(dim, self.cfg.sketch_dim, self.cfg.seed, layer).to(device)
        return self.srhts[key]

    def reset(self) -> None:
        """A new prompt begins (prefill at layer 0): forget the previous sequence."""
        self.step = 0
        self.walk_prev = None
        self.walk_alt_prev = None
        self.decode_states.clear()

    def density(self, phase: str, sparse_only: bool = True) -> float | None:
        c = self.counts.get(phase)
        return None if c is None else c.density(sparse_only)

    def _count(
        self, phase: str, kept: int | torch.Tensor, cand: int | torch.Tensor, sparse: bool
    ) -> None:
        self.counts.setdefault("prefill" if phase == "chunk" else phase, PairCounts()).add(
            kept, cand, sparse
        )

    def _plan_step(self, phase: str, mask: torch.Tensor | None, bsz: int, lk: int, device) -> None:
        """Layer 0 of a forward call: the step's plan, read once for all its layers."""
        valid = key_validity(mask, bsz, lk, device)
        self.plan = StepPlan.of(valid, phase, self.step, mask is not None, self.kernel_backend)
        self._plan_mask = mask

    def _valid(self, mask: torch.Tensor | None, bsz: int, lk: int, device) -> torch.Tensor:
        """A layer's real keys: the step's, unless the layer has a mask of its own (a sliding
        window layer's), whose validity is then read once for the step."""
        assert self.plan is not None
        if mask is self._plan_mask:
            return self.plan.key_valid
        return self.plan.once(("valid", id(mask)), lambda: key_validity(mask, bsz, lk, device))

    @property
    def timings(self) -> dict[str, float]:
        """Milliseconds per stage so far (on CUDA: one wait for the GPU here, none per layer)."""
        return {stage: float(ms) for stage, ms in self.stage_ms.items()}

    def _time(self, stage: str, ms: Duration) -> None:
        self.stage_ms[stage] = self.stage_ms.get(stage, 0.0) + ms

    # ---- the attention entry, one layer at a time ----

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """One layer's attention; every kernel it runs comes from this session's backend."""
        with use_backend(self.kernel_backend):
            return self._attend(layer, q, k, v, mask, scale)

    def _attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        bsz, _, lq, _ = q.shape
        lk = k.shape[2]
        phase = phase_of(lk - lq, lq)  # the cache hands over its keys with the new ones
        if layer == 0:
            self._begin(phase)
        if layer == 0 or self.plan is None:
            self._plan_step(phase, mask, bsz, lk, q.device)
        key_valid = self._valid(mask, bsz, lk, q.device)
        if self.on_layer is not None:
            self.on_layer(phase, self.step, layer)
        call = LayerCall(phase, layer, q, k, v, mask, key_valid, scale)
        exact, exact_rec = self._exact(call)
        plan: LayerPlan | None
        if phase == "prefill":
            plan, out, ms = self._prefill(call, exact)
        elif phase == "decode" and layer in self.decode_states:
            plan, out, ms = self._decode(call, exact)
        elif phase == "chunk" and layer in self.decode_states:
            plan, out, ms = self._chunk(call)
        else:
            if phase == "chunk" and not self.cfg.is_dense_layer(layer):
                warnings.warn(
                    "sketch_walk: queries after a cache without this sequence's prefill state "
                    "(or with decode kept dense) run dense",
                    stacklevel=2,
                )
            plan = None
            out, ms = self._dense(call)
        if self.recorder is not None and self.recorder.observes(phase):
            self._observe(call, plan, exact_rec, ms)
        return out

    def _begin(self, phase: str) -> None:
        """Layer 0 of a forward call: what the cache says this call is moves the sequence on."""
        if phase == "prefill":
            self.reset()
        elif phase == "decode":
            self.step += 1
        else:  # a chunk after a cache: its own walk across layers
            self.chunk_walk = None

    def _exact(self, call: LayerCall) -> tuple[Exact, ExactLater]:
        """The exact block mass of this layer step, computed here only: for a method that
        selects on it, the whole batch pooled as the config pools, at once; for the recorder,
        the mean mass of batch element 0, when the recorder asks (on its own stream, maybe).
        One pass serves both where they agree (pool "mean")."""
        cfg, q, k, kv, scale = self.cfg, call.q, call.k, call.key_valid, call.scale
        if call.phase == "prefill":
            selects = cfg.sparse_in("prefill") and not cfg.is_dense_layer(call.layer)
        else:
            selects = call.phase == "decode" and call.layer in self.decode_states
        chosen = None
        if selects and cfg.method_spec.needs_exact:
            chosen = layer_exact(q, k, kv, scale, cfg)
        rec = self.recorder
        if rec is None or not rec.observes(call.phase) or not rec.wants_exact(k.shape[2]):
            return chosen, None
        if chosen is not None and cfg.pool == "mean":
            return chosen, lambda: chosen
        return chosen, lambda: layer_exact(q[:1], k[:1], kv[:1], scale, cfg, pool="mean")

    def _observe(
        self, call: LayerCall, plan: LayerPlan | None, exact: ExactLater, ms: Duration
    ) -> None:
        """The recorder's one call site: what this layer step decided, read-only."""
        assert self.recorder is not None
        sparse = plan is not None and plan.selection is not None
        # recording reads the layer's times as numbers: on CUDA a wait per recorded layer
        timings = {k: float(v) for k, v in (plan.timings if plan is not None else {}).items()}
        timings["attention"] = ms = float(ms)
        if not sparse:
            timings["dense"] = ms
        elif self.recorder.options.time_dense:
            t0 = now_ms(call.q.device)
            dense_attention(call.q, call.k, call.v, call.mask, call.scale)
            timings["dense"] = now_ms(call.q.device) - t0
        self.recorder.record(
            LayerStep(
                phase=call.phase,
                step=self.step,
                layer=call.layer,
                plan=plan,
                exact=exact,
                q=call.q,
                k=call.k,
                key_valid=call.key_valid,
                scale=call.scale,
                block_size=self.cfg.block_size,
                density_target=self.cfg_for(call.layer).density if sparse else None,
                timings=timings,
            )
        )

    def _prefill(self, call: LayerCall, exact: Exact) -> Outcome:
        cfg = self.cfg_for(call.layer)
        sparse = cfg.sparse_in("prefill") and not cfg.is_dense_layer(call.layer)
        for_decode = cfg.sparse_in("decode") and not cfg.is_dense_layer(call.layer)
        plan: LayerPlan | None = None
        if sparse or for_decode or (self.recorder is not None and cfg.method != "dense"):
            srht = self.srht(call.layer, call.q.shape[-1], call.q.device)
            plan = prefill_plan(
                call.q,
                call.k,
                cfg,
                srht,
                self.walk_prev,
                call.key_valid,
                call.scale,
                select=sparse,
                exact=exact,
                step=self.plan,
                alternative=self.recorder is not None
                and -(-call.k.shape[2] // cfg.block_size) <= self.recorder.options.walk_max_blocks,
                prev_alt=self.walk_alt_prev,
            )
            self._time_stages(plan)
            if plan.walk_scores is not None:
                self.walk_prev = plan.walk_scores
            if plan.alternative is not None and plan.alternative.walk is not None:
                self.walk_alt_prev = plan.alternative.walk
            if for_decode:
                self.decode_states[call.layer] = start_decode(plan, call.q, srht, cfg, call.layer)
        if not sparse or plan is None:
            return (plan, *self._dense(call))
        return (plan, *self._sparse(call, plan))

    def _chunk(self, call: LayerCall) -> Outcome:
        """Queries after a cache (chunked prefill, a later turn): the layer's decode state takes
        the new tokens, the chunk's rows are walked and selected like a prefill's (and counted
        with it). The queries are front-padded to a block boundary so that kernel tiles are whole
        blocks; the pad is cut. Not recorded: a run's records are its prefill and decode steps."""
        cfg = self.cfg_for(call.layer)
        q, k = call.q, call.k
        lq, lk = q.shape[2], k.shape[2]
        sparse = cfg.sparse_in("prefill") and not cfg.is_dense_layer(call.layer)
        if sparse and not cfg.method_spec.chunks:
            warnings.warn(
                f"sketch_walk: {cfg.method} runs dense on queries after a cache", stacklevel=2
            )
            sparse = False
        srht = self.srht(call.layer, q.shape[-1], q.device)
        st = self.decode_states[call.layer]
        plan = chunk_step(
            st, q, k[:, :, -lq:], lk, cfg, srht, call.key_valid, self.chunk_walk, sparse, self.plan
        )
        self._time_stages(plan)
        if not sparse:
            return (None, *self._dense(call))
        self.chunk_walk = plan.walk_scores
        pad = (lk - lq) % cfg.block_size
        aligned = replace(call, q=torch.nn.functional.pad(q, (0, 0, pad, 0)))
        out, ms = self._sparse(aligned, plan)
        return plan, out[:, :, pad:], ms

    def _decode(self, call: LayerCall, exact: Exact) -> Outcome:
        with one_thread(call.q.device):  # dozens of tiny ops: see engine/hf/threads.py
            return self._decode_layer(call, exact)

    def _decode_layer(self, call: LayerCall, exact: Exact) -> Outcome:
        cfg = self.cfg_for(call.layer)
        st = self.decode_states[call.layer]
        q, k = call.q, call.k
        srht = self.srht(call.layer, q.shape[-1], q.device)
        key_valid = None if call.mask is None else call.key_valid
        if reusable(st, k.shape[2], cfg, cfg.decode_reselect):
            plan = decode_reuse(st, q, k[:, :, -1:], k.shape[2], cfg, srht, key_valid)
            self.decode_reused += 1
        else:
            plan = decode_step(
                st,
                q,
                k[:, :, -1:],
                k.shape[2],
                cfg,
                srht,
                call.key_valid,
                exact,
                keys=k,
                scale=call.scale,
                all_valid=call.mask is None,
                step=self.plan,
            )
        self._time_stages(plan)
        return (plan, *self._sparse(call, plan))

    def _time_stages(self, plan: LayerPlan) -> None:
        for stage, ms in plan.timings.items():
            self._time(stage, ms)

    def _sparse(self, call: LayerCall, plan: LayerPlan) -> tuple[torch.Tensor, Duration]:
        """The kept blocks through the kernel; returns the output and its time in ms."""
        sel = plan.selection
        assert sel is not None and self.plan is not None
        q = call.q
        seq_start = self.plan.starts(call.key_valid)
        watch = Stopwatch(q.device)
        out = None
        if call.phase == "decode" and self.cfg.decode_reselect != 1:
            out = self._decode_kept(call, sel, seq_start)
        if out is None:
            out = sparse_attention(
                self.cfg, sel, q, call.k, call.v, call.scale, seq_start, self.kernel_backend
            )
        ms = watch.stop()
        self._time("attention", ms)
        self._count(call.phase, sel.kept, sel.candidates, sparse=True)
        return out, ms

    def _decode_kept(
        self, call: LayerCall, sel: BlockLists, seq_start: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Decode with a selection kept across steps, through the backend's DecodeKeeper
        (kernels/backends.py; the CPU's gathers its K/V once); None where the backend keeps
        nothing (then the stateless kernel runs)."""
        st = self.decode_states.get(call.layer)
        keeper = backend_for(call.q.device, self.kernel_backend).decode
        if st is None or keeper is None:
            return None
        b = self.cfg.block_size
        lists = sel.starting_at(seq_start)  # the selection's own index tensor: told by identity
        spare_blocks = 2 + -(-self.cfg.decode_reselect // b)  # blocks it may cross
        q, k, v = call.q, call.k, call.v
        st.gathered = keeper.plan(st.gathered, q, k, v, lists, st.extended_from, spare_blocks)
        return None if st.gathered is None else keeper.run(st.gathered, q, k, v, call.scale)

    def _dense(self, call: LayerCall) -> tuple[torch.Tensor, Duration]:
        """Dense attention; returns the output and its time in ms."""
        q, k = call.q, call.k
        watch = Stopwatch(q.device)
        out = dense_attention(q, k, call.v, call.mask, call.scale)
        ms = watch.stop()
        self._time("attention", ms)
        nq = -(-q.shape[2] // self.cfg.block_size)
        nk = -(-k.shape[2] // self.cfg.block_size)
        cand = nk if q.shape[2] == 1 else nq * (nq + 1) // 2  # causal pairs (unpadded estimate)
        self._count(call.phase, cand, cand, sparse=False)
        return out, ms


def phase_of(past: int, lq: int) -> str:
    """What a forward call is, from the tokens already in the layer's cache: none, a prefill
    (a one-token prompt too); one new query, a decode step; several, a chunk."""
    if past == 0:
        return "prefill"
    return "decode" if lq == 1 else "chunk"


_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "sketch_walk_session", default=None
)


@contextlib.contextmanager
def sketch_walk_session(
    cfg: SketchWalkConfig | None = None,
    recorder: Recorder | None = None,
    on_layer: LayerHook | None = None,
    kernel_backend: str | None = None,
) -> Iterator[Session]:
    """Bind a fresh per-sequence state for the calls made inside the block."""
    session = Session(cfg or SketchWalkConfig(), recorder, on_layer, kernel_backend)
    token = _current.set(session)
    try:
        yield session
    finally:
        _current.reset(token)


@contextlib.contextmanager
def bind_session(session: Session) -> Iterator[Session]:
    """Bind an existing session (e.g. a copy taken after a prefill) for the calls inside."""
    token = _current.set(session)
    try:
        yield session
    finally:
        _current.reset(token)


_dense: contextvars.ContextVar[bool] = contextvars.ContextVar("sketch_walk_dense", default=False)


@contextlib.contextmanager
def dense_context() -> Iterator[None]:
    """Inside: this context's attention calls run the model's own SDPA attention, the function
    and masks of attn_implementation="sdpa". A run's dense side then shares the loaded model
    with a sparse session in another thread (the implementation is the model's, not the
    thread's)."""
    token = _dense.set(True)
    try:
        yield
    finally:
        _dense.reset(token)


def in_dense_context() -> bool:
    """Whether this context's attention calls are dense_context's."""
    return _dense.get()


def current_session() -> Session:
    """The bound session; outside any, an implicit one with default config for this context."""
    session = _current.get()
    if session is None:
        session = Session(SketchWalkConfig())
        _current.set(session)
    return session

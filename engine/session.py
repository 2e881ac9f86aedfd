"""Per-sequence state of one forward/generate call, bound in a context variable.

The attention function is called layer by layer without any handle to "this run": the walk needs
the previous layer's scores and decode needs every layer's grown A_l. Binding that state to a
context (not to modules or globals) keeps two runs, threads or requests from ever sharing it.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from sketchwalk.kernels import choose_backend, decode_cache

from .blockstats import exact_block_mass
from .config import SketchWalkConfig
from .dense import dense_attention, key_validity
from .pipeline import (
    DecodeLayerState,
    Plan,
    chunk_step,
    decode_reuse,
    decode_step,
    prefill_plan,
    reusable,
    sparse_attention,
    start_decode,
)
from .recorder import Recorder
from .sketch import SRHT, make_srht

ProgressFn = Callable[[str, int, int], None]  # (phase, step, layer)


@dataclass
class Session:
    cfg: SketchWalkConfig
    recorder: Recorder | None = None
    progress: ProgressFn | None = None
    kernel_backend: str | None = None
    # decode re-selects at least every this many tokens (1: every token; 0: when a key block
    # starts); between, a layer keeps its last selection (see pipeline.reusable)
    decode_reselect: int = 1
    decode_reused: int = 0  # (layer, step) decode pairs that kept their last selection
    step: int = 0
    walk_prev: torch.Tensor | None = None
    chunk_walk: torch.Tensor | None = None  # the current chunk's rows of the previous layer's walk
    decode_states: dict[int, DecodeLayerState] = field(default_factory=dict)
    srhts: dict[tuple[int, int, str], SRHT] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    _ones: torch.Tensor | None = None  # the all-valid key mask of the current length
    # kept (row, block) pairs and all causal pairs, per phase, over sparse layers / all layers
    counts: dict[str, list[int]] = field(default_factory=dict)

    def srht(self, layer: int, dim: int, device: torch.device) -> SRHT:
        key = (layer, dim, str(device))
        if key not in self.srhts:
            self.srhts[key] = make_srht(dim, self.cfg.sketch_dim, self.cfg.seed, layer).to(device)
        return self.srhts[key]

    def reset(self) -> None:
        """A new prompt begins (prefill at layer 0): forget the previous sequence."""
        self.step = 0
        self.walk_prev = None
        self.decode_states.clear()

    def density(self, phase: str, sparse_only: bool = True) -> float | None:
        c = self.counts.get(phase)
        if not c:
            return None
        kept, cand = (c[0], c[1]) if sparse_only else (c[2], c[3])
        return kept / cand if cand else None

    def _count(self, phase: str, kept: int, cand: int, sparse: bool) -> None:
        c = self.counts.setdefault(phase, [0, 0, 0, 0])
        if sparse:
            c[0] += kept
            c[1] += cand
        c[2] += kept
        c[3] += cand

    def _key_validity(self, mask, bsz: int, lk: int, device: torch.device) -> torch.Tensor:
        """key_validity, but without a mask the all-true [B, Lk] is built once per step, not
        once per layer (a decode step is bound by the number of small ops)."""
        if mask is not None:
            return key_validity(mask, bsz, lk, device)
        c = self._ones
        if c is None or c.shape != (bsz, lk) or c.device != device:
            c = self._ones = torch.ones(bsz, lk, dtype=torch.bool, device=device)
        return c

    def _time(self, stage: str, ms: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + ms

    # ---- the attention entry, one layer at a time ----

    def attend(self, layer: int, q, k, v, mask, scale: float) -> torch.Tensor:
        bsz, _, lq, _ = q.shape
        lk = k.shape[2]
        if lq == lk and layer == 0:
            self.reset()
        if lq == 1 and lk > 1 and layer == 0:
            self.step += 1
        if 1 < lq < lk and layer == 0:  # a chunk after a cache: its own walk across layers
            self.chunk_walk = None
        phase = "prefill" if lq > 1 else "decode"
        if self.progress is not None:
            self.progress(phase, self.step, layer)
        key_valid = self._key_validity(mask, bsz, lk, q.device)
        if lq == lk:
            return self._prefill(layer, q, k, v, mask, key_valid, scale)
        if lq == 1 and layer in self.decode_states:
            return self._decode(layer, q, k, v, mask, key_valid, scale)
        if lq > 1 and layer in self.decode_states:
            return self._chunk(layer, q, k, v, mask, key_valid, scale)
        if lq > 1 and not self.cfg.is_dense_layer(layer):
            warnings.warn(
                "sketch_walk: queries after a cache without this sequence's prefill state "
                "(or with decode kept dense) run dense",
                stacklevel=2,
            )
        return self._dense(phase, layer, None, q, k, v, mask, key_valid, scale)

    def _prefill(self, layer, q, k, v, mask, key_valid, scale) -> torch.Tensor:
        cfg = self.cfg
        sparse = cfg.sparse_in("prefill") and not cfg.is_dense_layer(layer)
        for_decode = cfg.sparse_in("decode") and not cfg.is_dense_layer(layer)
        rec = self.recorder
        plan: Plan | None = None
        if sparse or for_decode or (rec is not None and cfg.method != "dense"):
            want_exact = rec is not None and rec.wants_exact(k.shape[2])
            plan = prefill_plan(
                q,
                k,
                cfg,
                self.srht(layer, q.shape[-1], q.device),
                self.walk_prev,
                key_valid,
                scale,
                select=sparse,
                want_exact=want_exact,
            )
            for stage, ms in plan.timings.items():
                self._time(stage, ms)
            if plan.w is not None:
                self.walk_prev = plan.w
            if for_decode:
                self.decode_states[layer] = start_decode(
                    plan, q, self.srht(layer, q.shape[-1], q.device), cfg
                )
        if not sparse:
            return self._dense("prefill", layer, plan, q, k, v, mask, key_valid, scale)
        return self._sparse("prefill", layer, plan, q, k, v, mask, key_valid, scale)

    def _chunk(self, layer, q, k, v, mask, key_valid, scale) -> torch.Tensor:
        """Queries after a cache (chunked prefill, a later turn): the layer's decode state takes
        the new tokens, the chunk's rows are walked and selected like a prefill's. The queries are
        front-padded to a block boundary so that kernel tiles are whole blocks; the pad is cut.
        Not recorded: a run's records are its prefill and its decode steps."""
        cfg = self.cfg
        lq, lk = q.shape[2], k.shape[2]
        sparse = cfg.sparse_in("prefill") and not cfg.is_dense_layer(layer)
        if sparse and not cfg.method_spec.chunks:
            warnings.warn(
                f"sketch_walk: {cfg.method} runs dense on queries after a cache", stacklevel=2
            )
            sparse = False
        srht = self.srht(layer, q.shape[-1], q.device)
        st = self.decode_states[layer]
        plan = chunk_step(
            st, q, k[:, :, -lq:], lk, cfg, srht, key_valid, self.chunk_walk, select=sparse
        )
        for stage, ms in plan.timings.items():
            self._time(stage, ms)
        if not sparse:
            return self._dense("prefill", layer, None, q, k, v, mask, key_valid, scale, False)
        self.chunk_walk = plan.w
        pad = (lk - lq) % cfg.block_size
        q_aligned = torch.nn.functional.pad(q, (0, 0, pad, 0))
        out = self._sparse("prefill", layer, plan, q_aligned, k, v, mask, key_valid, scale, False)
        return out[:, :, pad:]

    def _decode(self, layer, q, k, v, mask, key_valid, scale) -> torch.Tensor:
        cfg = self.cfg
        st = self.decode_states[layer]
        exact = None
        if cfg.method_spec.needs_exact:
            exact = exact_block_mass(q, k, scale, cfg.block_size, key_valid, cfg.groups(k.shape[1]))
        srht = self.srht(layer, q.shape[-1], q.device)
        if reusable(st, k.shape[2], cfg, self.decode_reselect):
            plan = decode_reuse(
                st, q, k[:, :, -1:], k.shape[2], cfg, srht, None if mask is None else key_valid
            )
            self.decode_reused += 1
        else:
            plan = decode_step(
                st, q, k[:, :, -1:], k.shape[2], cfg, srht, key_valid, exact, keys=k, scale=scale
            )
        for stage, ms in plan.timings.items():
            self._time(stage, ms)
        return self._sparse("decode", layer, plan, q, k, v, mask, key_valid, scale)

    def _sparse(
        self, phase, layer, plan: Plan, q, k, v, mask, key_valid, scale, record: bool = True
    ) -> torch.Tensor:
        sel = plan.selection
        all_valid = mask is None or bool(key_valid.all())  # no mask: no padding, no sync
        seq_start = None if all_valid else key_valid.float().argmax(dim=1)
        t0 = _now(q)
        out = None
        if phase == "decode" and self.decode_reselect != 1:
            out = self._decode_gathered(layer, sel, q, k, v, scale, seq_start)
        if out is None:
            out = sparse_attention(self.cfg, sel, q, k, v, scale, seq_start, self.kernel_backend)
        timings = dict(plan.timings, attention=_now(q) - t0)
        self._time("attention", timings["attention"])
        self._count(phase, sel.kept, sel.candidates, sparse=True)
        if self.recorder is not None and record:
            if self.recorder.options.time_dense:
                t0 = _now(q)
                dense_attention(q, k, v, mask, scale)
                timings["dense"] = _now(q) - t0
            self.recorder.record(
                phase,
                self.step,
                layer,
                plan,
                q,
                k,
                key_valid,
                scale,
                self.cfg.block_size,
                self.cfg.density,
                timings,
            )
        return out

    def _decode_gathered(self, layer, sel, q, k, v, scale, seq_start) -> torch.Tensor | None:
        """Decode with a selection kept across steps: its K/V gathered once (kernels/decode_cache);
        None where that path does not apply (then the stateless kernel runs)."""
        st = self.decode_states.get(layer)
        if st is None or choose_backend(q.device, self.kernel_backend) != "cpu":
            return None
        if not decode_cache.supports(q, k, sel.block_index.shape[1], seq_start):
            return None
        cur = (k.shape[2] - 1) // self.cfg.block_size
        g = st.gathered
        if g is None or g.source is not sel or g.cur != cur:
            try:
                g = decode_cache.gather(
                    k,
                    v,
                    sel.block_index,
                    sel.block_count,
                    self.cfg.block_size,
                    k.shape[2],
                    sel,
                    heads=q.shape[1],
                )
            except ValueError:
                st.gathered = None
                return None
            st.gathered = g
        return decode_cache.attend(g, q, k, v, scale)

    def _dense(
        self, phase, layer, plan: Plan | None, q, k, v, mask, key_valid, scale, record=True
    ) -> torch.Tensor:
        t0 = _now(q)
        out = dense_attention(q, k, v, mask, scale)
        ms = _now(q) - t0
        self._time("attention", ms)
        nq = -(-q.shape[2] // self.cfg.block_size)
        nk = -(-k.shape[2] // self.cfg.block_size)
        cand = nk if q.shape[2] == 1 else nq * (nq + 1) // 2  # causal pairs (unpadded estimate)
        self._count(phase, cand, cand, sparse=False)
        if self.recorder is not None and record:
            timings = dict(plan.timings if plan else {}, attention=ms, dense=ms)
            self.recorder.record(
                phase,
                self.step,
                layer,
                plan,
                q,
                k,
                key_valid,
                scale,
                self.cfg.block_size,
                None,
                timings,
            )
        return out


def _now(x: torch.Tensor) -> float:
    if x.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() * 1e3


_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "sketch_walk_session", default=None
)


@contextlib.contextmanager
def sketch_walk_session(
    cfg: SketchWalkConfig | None = None,
    recorder: Recorder | None = None,
    progress: ProgressFn | None = None,
    kernel_backend: str | None = None,
    decode_reselect: int = 1,
) -> Iterator[Session]:
    """Bind a fresh per-sequence state for the calls made inside the block."""
    if decode_reselect < 0:
        raise ValueError(f"decode_reselect must be >= 0, got {decode_reselect}")
    session = Session(cfg or SketchWalkConfig(), recorder, progress, kernel_backend)
    session.decode_reselect = decode_reselect
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


def current_session() -> Session:
    """The bound session; outside any, an implicit one with default config for this context."""
    session = _current.get()
    if session is None:
        session = Session(SketchWalkConfig())
        _current.set(session)
    return session

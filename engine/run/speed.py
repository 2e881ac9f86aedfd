"""What a run's timings say about speed: dense and sparse side by side, clean and recorded.

One reading of the `timings` a run stores (engine/run/runner.py; the `clean_*` keys come from
engine/run/timing.py), shared by `sketchwalk run`'s summary and the app's Speed page so both show
the same numbers. The clean pass is the headline: no recorder, last-token logits only, what a
user's own code would see. The run's own passes (recorded, unless the run was time-only) and
the recording overhead sit beside it. Pure Python: no torch.

"Attention alone" compares the dense model's attention with the sparse path's whole cost,
selection (sketch, walk, select) included: that is what replacing one by the other saves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Timings = Mapping[str, Any]

CLEAN_FAILED = "clean_failed"
"""The timings key of a run whose clean passes failed: one line saying why (a text, not a
number; the run is done with its quality half)."""


@dataclass(frozen=True)
class Pair:
    """One measurement, dense beside sparse."""

    phase: str  # "prefill" (ms) or "decode" (ms per token)
    scope: str  # "whole model" or "attention alone"
    dense_ms: float | None
    sparse_ms: float | None

    @property
    def label(self) -> str:
        return f"{self.phase.capitalize()}, {self.scope}"

    @property
    def unit(self) -> str:
        return "ms" if self.phase == "prefill" else "ms/token"

    @property
    def ratio(self) -> float | None:
        """Dense time over sparse time: above 1 the sparse model is faster."""
        if not self.dense_ms or not self.sparse_ms or self.dense_ms < 0 or self.sparse_ms < 0:
            return None
        return self.dense_ms / self.sparse_ms

    def as_dict(self) -> dict[str, float | None]:
        return {"dense_ms": self.dense_ms, "sparse_ms": self.sparse_ms, "ratio": self.ratio}


def _num(t: Timings, key: str) -> float | None:
    v = t.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None else a + (b or 0.0)


def has_clean(t: Timings) -> bool:
    """Whether the run timed a clean pass (runs stored before that, or with it off, did not)."""
    return _num(t, "clean_sparse_prefill_ms") is not None


def clean_pairs(t: Timings) -> list[Pair]:
    """Prefill and decode, whole model and attention alone, of the clean pass (empty without)."""
    if not has_clean(t):
        return []
    pairs = [
        Pair(
            "prefill",
            "whole model",
            _num(t, "clean_dense_prefill_ms"),
            _num(t, "clean_sparse_prefill_ms"),
        ),
        Pair(
            "prefill",
            "attention alone",
            _num(t, "clean_dense_attention_ms"),
            _plus(_num(t, "clean_sparse_attention_ms"), _num(t, "clean_sparse_selection_ms")),
        ),
    ]
    if _num(t, "clean_sparse_decode_ms_per_token") is not None:  # runs with new tokens
        pairs += [
            Pair(
                "decode",
                "whole model",
                _num(t, "clean_dense_decode_ms_per_token"),
                _num(t, "clean_sparse_decode_ms_per_token"),
            ),
            Pair(
                "decode",
                "attention alone",
                _num(t, "clean_dense_decode_attention_ms"),
                _plus(
                    _num(t, "clean_sparse_decode_attention_ms"),
                    _num(t, "clean_sparse_decode_selection_ms"),
                ),
            ),
        ]
    return pairs


@dataclass(frozen=True)
class Ceiling:
    """The most a phase can gain at this length (Amdahl): attention is only part of the dense
    model's time, and the rest (projections, MLP, the weights' reads in decode) both models pay.
    A short prompt's ceiling is low whatever the kernel does; this says so next to the ratio."""

    phase: str
    attention_share: float  # the dense model's attention time / its whole time, in [0, 1)
    density: float

    @classmethod
    def of(
        cls, phase: str, attn: float | None, whole: float | None, density: float
    ) -> Ceiling | None:
        """From the dense pass's attention and whole times; None where they give no share."""
        if attn is None or not whole or whole <= 0 or not 0.0 <= attn < whole:
            return None
        return cls(phase, attn / whole, density)

    @property
    def at_density(self) -> float:
        """Dense over sparse time if attention cost `density` x dense's in every layer and the
        selection cost nothing: an upper bound for the whole model at this density."""
        return 1.0 / (1.0 - self.attention_share * (1.0 - self.density))

    @property
    def free(self) -> float:
        """The same if sparse attention cost nothing at all."""
        return 1.0 / (1.0 - self.attention_share)


def ceiling_density(achieved: float | None, target: float | None) -> float | None:
    """The density a run's ceilings assume: the achieved one over the sparse layers, else the
    target (runs without a measured density)."""
    return achieved if achieved is not None else target


def ceilings(t: Timings, density: float | None) -> list[Ceiling]:
    """Prefill and decode ceilings from the clean dense pass (none without one or a density)."""
    if density is None or not 0.0 <= density <= 1.0:
        return []
    cs = (
        Ceiling.of(phase, _num(t, attn_key), _num(t, whole_key), density)
        for phase, attn_key, whole_key in (
            ("prefill", "clean_dense_attention_ms", "clean_dense_prefill_ms"),
            ("decode", "clean_dense_decode_attention_ms", "clean_dense_decode_ms_per_token"),
        )
    )
    return [c for c in cs if c is not None]


def ceiling_text(cs: list[Ceiling]) -> str | None:
    """One sentence for the CLI and the Speed page."""
    if not cs:
        return None
    d = cs[0].density
    shares = " and ".join(f"{c.attention_share:.0%} of the dense {c.phase}" for c in cs)
    best = "; ".join(f"{c.phase} {c.at_density:.2f}x" for c in cs)
    free = "; ".join(f"{c.phase} {c.free:.2f}x" for c in cs)
    return (
        f"ceiling at this length: attention is {shares}, so at density {d:.2f} with free "
        f"selection the whole model is at most {best} faster (with free attention: {free})"
    )


def run_pairs(t: Timings) -> list[Pair]:
    """The run's own dense and sparse passes (with the recorder, unless time-only)."""
    pairs = [
        Pair("prefill", "whole model", _num(t, "dense_prefill_ms"), _num(t, "sparse_prefill_ms"))
    ]
    if _num(t, "sparse_decode_ms_per_token") is not None:
        pairs.append(
            Pair(
                "decode",
                "whole model",
                _num(t, "dense_decode_ms_per_token"),
                _num(t, "sparse_decode_ms_per_token"),
            )
        )
    return pairs


def recording_overhead(t: Timings) -> dict[str, float]:
    """What the recorder added to the sparse pass: ms (prefill) and ms/token (decode), and each
    as a fraction of the clean pass. Empty for time-only runs and runs without a clean pass."""
    out: dict[str, float] = {}
    for phase, key, clean_key in (
        ("prefill", "recording_overhead_prefill_ms", "clean_sparse_prefill_ms"),
        ("decode", "recording_overhead_decode_ms_per_token", "clean_sparse_decode_ms_per_token"),
    ):
        extra, clean = _num(t, key), _num(t, clean_key)
        if extra is None:
            continue
        out[f"{phase}_ms"] = extra
        if clean:
            out[f"{phase}_fraction"] = extra / clean
    return out


def summary(t: Timings, time_only: bool = False, density: float | None = None) -> dict[str, Any]:
    """The JSON a run summary prints: clean pairs (the headline), the run's own passes (recorded
    unless time-only), the recording overhead, the ceilings at `density` (the achieved one)."""

    def keyed(pairs: list[Pair]) -> dict[str, dict]:
        return {f"{p.phase} {p.scope}".replace(" ", "_"): p.as_dict() for p in pairs}

    cs = ceilings(t, density)
    return {
        "clean": keyed(clean_pairs(t)) or None,
        "run_passes": keyed(run_pairs(t)),
        "run_passes_recorded": not time_only,
        "recording_overhead": recording_overhead(t) or None,
        "ceiling": {
            c.phase: {
                "attention_share": c.attention_share,
                "density": c.density,
                "at_density": c.at_density,
                "attention_free": c.free,
            }
            for c in cs
        }
        or None,
    }


def machine_text(versions: Mapping[str, Any] | None) -> str | None:
    """Where the run was timed, from its stored versions (engine/run/runner.py): 'Timed on [GPU on]
    CPU (ISA, N threads[, C kernels off]), torch X, transformers Y'; None for runs
    stored before the machine was kept.
    Values come from the store (perhaps an imported file): only strings are used, and the
    caller escapes them for its renderer."""
    if not isinstance(versions, Mapping):
        return None
    v = {k: x[:120] for k, x in versions.items() if isinstance(x, str) and x}
    if "cpu" not in v:
        return None
    threads = v.get("threads")
    if threads:
        threads = f"{threads} thread" + ("" if threads == "1" else "s")
    # no C kernels where it ran (no compiler: a ~2x slower selection): said, not the norm; some
    # stored runs name only the block softmax's kind
    off = v.get("c_kernels") == "off" or v.get("block_softmax") == "torch"
    slow = "C kernels off" if off else None
    how = ", ".join(x for x in (v.get("isa"), threads, slow) if x)
    where = f"{v['gpu']} on {v['cpu']}" if "gpu" in v else v["cpu"]
    libs = [f"{name} {v[name]}" for name in ("torch", "transformers") if name in v]
    return ", ".join([f"Timed on {where}" + (f" ({how})" if how else ""), *libs])


def lines(t: Timings, time_only: bool = False, density: float | None = None) -> list[str]:
    """The same, as the few lines `sketchwalk run` prints."""

    def fmt(p: Pair) -> str:
        d = "-" if p.dense_ms is None else f"{p.dense_ms:.1f}"
        s = "-" if p.sparse_ms is None else f"{p.sparse_ms:.1f}"
        r = "" if p.ratio is None else f" ({p.ratio:.2f}x)"
        return f"{p.phase} {p.scope} {d} -> {s} {p.unit}{r}"

    out = []
    clean = clean_pairs(t)
    if clean:
        out.append("speed, clean pass (dense -> sparse): " + "; ".join(map(fmt, clean)))
    elif isinstance(t.get(CLEAN_FAILED), str):
        out.append(f"speed: {t[CLEAN_FAILED]} (the times below include the recorder's work)")
    else:
        out.append("speed: no clean-pass timings in this run (the times below include its work)")
    own = "time-only pass (no recorder)" if time_only else "recorded pass"
    out.append(f"speed, {own}: " + "; ".join(map(fmt, run_pairs(t))))
    over = recording_overhead(t)
    if over:
        parts = [
            f"{phase} {over[f'{phase}_ms']:+.1f} {unit}"
            + (f" ({over[f'{phase}_fraction']:+.0%})" if f"{phase}_fraction" in over else "")
            for phase, unit in (("prefill", "ms"), ("decode", "ms/token"))
            if f"{phase}_ms" in over
        ]
        out.append("recording overhead (sparse): " + "; ".join(parts))
    text = ceiling_text(ceilings(t, density))
    if text:
        out.append(text)
    return out

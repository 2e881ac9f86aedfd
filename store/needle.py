"""Needle tracking: where the blocks holding a piece of the prompt were kept or dropped.

Shared by `sketchwalk trace` and the Explore page (no Streamlit here). A needle is every
occurrence of a text in the prompt, found in the stored prompt tokens (their texts joined), and
mapped to the key blocks that hold its tokens. For each recorded (phase, step, layer), the row
that produces the next token (the last prompt block in prefill, the new token in decode) says
whether each needle block was kept, the exact attention mass the needle got (where recorded),
and each block's rank among the scores the selection used (walk scores; 1 = top).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sketchwalk.errors import SketchWalkError

PASS_KEY = re.compile(r"The pass key is (\d{5})\. Remember it\.")
"""The needle sentence of a pass-key prompt (the app's samples and eval/retrieval.py alike)."""


def pass_key(prompt: str) -> str | None:
    """The key a pass-key prompt hides (what Explore follows and the verdict checks), else None."""
    m = PASS_KEY.search(prompt or "")
    return m.group(1) if m else None


class NeedleNotFound(SketchWalkError):
    """The text does not occur in the run's prompt."""


@dataclass
class Needle:
    """Every occurrence of `text` in the prompt: token spans [start, end) and their blocks."""

    text: str
    spans: list[tuple[int, int]]
    blocks: list[int]


@dataclass
class NeedleStep:
    """The needle at one (phase, step, layer): per needle block, kept and rank; mass share."""

    phase: str
    step: int
    layer: int
    dense: bool
    q_block: int
    blocks: list[int]
    kept: list[bool]
    ranks: list[int | None]
    mass: float | None  # exact softmax mass on the needle's blocks, share of the row (0..1)

    @property
    def all_kept(self) -> bool:
        return all(self.kept)

    @property
    def label(self) -> str:
        return "prefill" if self.phase == "prefill" else f"decode {self.step}"


@dataclass
class NeedleTrace:
    run_id: str
    needle: Needle
    steps: list[NeedleStep] = field(default_factory=list)

    def first_drop(self) -> NeedleStep | None:
        """The first record (prefill layers, then decode steps) that dropped a needle block."""
        return next((s for s in self.steps if not s.all_kept), None)

    def sentence(self) -> str:
        """One plain sentence saying where the needle was first dropped (or that it never was)."""
        where = ", ".join(f"B{b}" for b in self.needle.blocks)
        drop = self.first_drop()
        if not self.steps:
            return f"The needle is in block(s) {where}; this run recorded no layers."
        if drop is None:
            return f"The needle (block(s) {where}) was kept at every recorded layer and step."
        lost = [b for b, k in zip(drop.blocks, drop.kept, strict=True) if not k]
        ranks = [r for b, r in zip(drop.blocks, drop.ranks, strict=True) if b in lost]
        rank = f", rank {ranks[0]} in the scores" if ranks and ranks[0] is not None else ""
        mass = f", exact mass {drop.mass:.3f}" if drop.mass is not None else ""
        n_drop = sum(not s.all_kept for s in self.steps)
        return (
            f"The needle was first dropped at {drop.label}, layer {drop.layer}: "
            f"block(s) {', '.join(f'B{b}' for b in lost)} not kept{rank}{mass}; "
            f"dropped at {n_drop} of {len(self.steps)} recorded layer-steps."
        )

    def as_dict(self) -> dict[str, Any]:
        """One JSON-ready object (what `sketchwalk trace --json` prints)."""
        drop = self.first_drop()
        return {
            "run_id": self.run_id,
            "text": self.needle.text,
            "spans": [list(s) for s in self.needle.spans],
            "blocks": self.needle.blocks,
            "first_drop": None if drop is None else asdict(drop),
            "summary": self.sentence(),
            "steps": [asdict(s) for s in self.steps],
        }


MAX_SPANS = 256
"""Occurrences of a needle followed (the first ones): a text repeated all over the prompt is
no needle, and its spans would grow with the prompt."""


def needle_spans(pieces: Iterable[list[str]], text: str) -> list[tuple[int, int]]:
    """Token spans [first, last) of the first MAX_SPANS occurrences of `text` (overlapping ones
    included) in the prompt given as its token texts in order, piece by piece: memory holds one
    piece and the few tokens before it that an occurrence may start in."""
    spans: list[tuple[int, int]] = []
    carried: list[str] = []  # the last tokens of the pieces so far, len(text) - 1 chars or more
    first = 0  # the token index of carried[0]
    for piece in pieces:
        texts = carried + [str(x) for x in piece]
        joined = "".join(texts)
        starts = np.cumsum([0] + [len(x) for x in texts])
        old = int(starts[len(carried)])  # chars already searched: skip what they held whole
        at = joined.find(text, max(old - len(text) + 1, 0))
        while at >= 0 and len(spans) < MAX_SPANS:
            lo = int(np.searchsorted(starts, at, side="right") - 1)
            hi = int(np.searchsorted(starts, at + len(text), side="left"))  # exclusive
            spans.append((first + lo, first + max(hi, lo + 1)))
            at = joined.find(text, at + 1)
        if len(spans) >= MAX_SPANS:
            break
        keep = len(texts)
        while keep > 0 and int(starts[-1] - starts[keep]) < len(text) - 1:
            keep -= 1
        first += keep
        carried = texts[keep:]
    return spans


def _needle(text: str, spans: list[tuple[int, int]], blocks: pd.DataFrame) -> Needle:
    """The needle of these spans, with the key blocks holding their tokens; raises
    NeedleNotFound when there are none."""
    if not spans:
        shown = text if len(text) <= 40 else text[:39] + "…"
        raise NeedleNotFound(f"the text {shown!r} does not occur in the run's prompt")
    bounds = blocks.sort_values("block")
    ends = bounds["token_end"].to_numpy()
    ids = bounds["block"].to_numpy()
    found: set[int] = set()
    for s, e in spans:
        lo = int(np.searchsorted(ends, s, side="right"))
        hi = int(np.searchsorted(ends, e - 1, side="right"))
        found.update(int(ids[i]) for i in range(lo, min(hi, len(ids) - 1) + 1))
    return Needle(text, spans, sorted(found))


def find_needle(
    text: str, tokens: pd.DataFrame, blocks: pd.DataFrame, prompt_tokens: int
) -> Needle:
    """Every occurrence of `text` in the prompt (up to MAX_SPANS), as token spans and key
    blocks, from the run's tokens and blocks frames.

    Raises NeedleNotFound (one line) when the text is empty or not in the prompt.
    """
    if not text:
        raise NeedleNotFound("the needle text is empty")
    t = tokens[(tokens["variant"] == "sparse") & (tokens["position"] < prompt_tokens)]
    texts = [str(x) for x in t.sort_values("position")["text"]]
    return _needle(text, needle_spans([texts], text), blocks)


def find_needle_in(store: Any, run_id: str, text: str) -> Needle:
    """`find_needle` on a stored run, its prompt read piece by piece (store.prompt_texts) and
    its blocks without their text: memory stays bounded whatever the prompt's length."""
    if not text:
        raise NeedleNotFound("the needle text is empty")
    spans = needle_spans(store.prompt_texts(run_id), text)
    return _needle(text, spans, store.blocks(run_id, text_chars=0))


def score_ranks(scores: np.ndarray, cols: list[int]) -> list[int | None]:
    """1-based rank of each column among the row's finite scores (ties share the best rank)."""
    s = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(s)
    out: list[int | None] = []
    for j in cols:
        if j >= s.size or not finite[j]:
            out.append(None)
        else:
            out.append(int((s[finite] > s[j]).sum()) + 1)
    return out


def needle_steps(rows: list[dict[str, Any]], needle: Needle) -> list[NeedleStep]:
    """Per recorded row (store.last_rows output): the needle's kept flags, ranks and mass."""
    out: list[NeedleStep] = []
    for r in rows:
        n = int(r["n_blocks"])
        cols = [b for b in needle.blocks if b < n]
        if not cols:
            continue
        dense = bool(r["dense"])
        sel = np.asarray(r["selected"], dtype=bool)
        kept = [True] * len(cols) if dense else [bool(sel[j]) for j in cols]
        scores = np.asarray(r["walk"], dtype=np.float32)
        ranks = [None] * len(cols) if dense or np.isnan(scores).all() else score_ranks(scores, cols)
        exact = np.asarray(r["exact"], dtype=np.float64)
        total = np.nansum(exact)
        mass = None
        if np.isfinite(exact[cols]).any() and total > 0:
            mass = float(np.nansum(exact[cols]) / total)
        out.append(
            NeedleStep(
                r["phase"],
                int(r["step"]),
                int(r["layer"]),
                dense,
                int(r["q_block"]),
                cols,
                kept,
                ranks,
                mass,
            )
        )
    return out


def trace(store: Any, run_id: str, text: str) -> NeedleTrace:
    """Find `text` in a stored run's prompt and follow its blocks through every record."""
    needle = find_needle_in(store, run_id, text)
    return NeedleTrace(str(run_id), needle, needle_steps(store.last_rows(run_id), needle))


def strip_matrix(steps: list[NeedleStep]) -> dict[str, Any]:
    """Layers x (prefill, decode 1, ...) arrays for the strip: kept share, mass, best rank."""
    cols = sorted({(s.phase != "prefill", s.step) for s in steps})
    layers = sorted({s.layer for s in steps})
    ci = {c: i for i, c in enumerate(cols)}
    li = {layer: i for i, layer in enumerate(layers)}
    kept = np.full((len(layers), len(cols)), np.nan, dtype=np.float32)
    mass = np.full_like(kept, np.nan)
    rank = np.full_like(kept, np.nan)
    dense = np.zeros(kept.shape, dtype=bool)
    for s in steps:
        i, j = li[s.layer], ci[(s.phase != "prefill", s.step)]
        kept[i, j] = float(np.mean(s.kept))
        mass[i, j] = np.nan if s.mass is None else s.mass
        ranks = [r for r in s.ranks if r is not None]
        rank[i, j] = min(ranks) if ranks else np.nan
        dense[i, j] = s.dense
    labels = ["prefill" if not d else f"decode {st}" for d, st in cols]
    return {
        "layers": layers,
        "columns": labels,
        "kept": kept,
        "mass": mass,
        "rank": rank,
        "dense": dense,
    }

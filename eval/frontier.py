"""The frontier: quality against density for the exact-mass oracle and every method, at each
block size and selection granularity, so the distance from an estimator to the best block
selection there is can be read off one table.

The oracle ranks blocks by their exact attention mass (a dense softmax): at a given block size,
granularity and density it is the best a block estimator can hope for. `distance_to_oracle`
pairs each method's cell with the oracle's at the same settings, and says what each cell's
selection cost against the dense model's attention (fidelity is bought with selection time).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sketchwalk.errors import SketchWalkError

from .grid import GridSpec
from .report import selection_share

GRANULARITIES = {"layer": False, "group": True}  # name -> per_group


def variant_label(config: dict[str, Any]) -> str:
    """'b32 group' for a cell's config: what the frontier varies besides method and density."""
    per = "group" if config.get("per_group") else "layer"
    return f"b{config.get('block_size')} {per}"


def frontier_spec(
    methods: Sequence[str],
    densities: Sequence[float],
    blocks: Sequence[int],
    granularities: Sequence[str],
    base: dict[str, Any],
    phases: str = "prefill",
    kernel_backend: str | None = None,
) -> GridSpec:
    """A grid over (block size x granularity) x methods x densities, the oracle always in it."""
    unknown = [g for g in granularities if g not in GRANULARITIES]
    if unknown:
        raise SketchWalkError(
            f"unknown granularity {unknown[0]!r}; choose from {', '.join(GRANULARITIES)}"
        )
    if not blocks or not granularities:
        raise SketchWalkError("the frontier needs at least one block size and one granularity")
    names = tuple(dict.fromkeys(["oracle", *methods]))
    variants = tuple(
        {"block_size": int(b), "per_group": GRANULARITIES[g]} for b in blocks for g in granularities
    )
    return GridSpec(
        methods=names,
        densities=tuple(densities),
        phases=phases,
        new_tokens=0,
        base=dict(base),
        kernel_backend=kernel_backend,
        variants=variants,
    )


def _cell(row: dict[str, Any]) -> tuple:
    return (
        row["model_id"],
        row["task"],
        row["source"],
        row["length"],
        float(row["density_target"]),
        variant_label(row["config"]),
    )


def distance_to_oracle(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with the oracle's KL and perplexity at the same cell and the gaps to them."""
    rows = list(rows)
    oracle = {_cell(r): r for r in rows if r["method"] == "oracle"}
    out = []
    for r in rows:
        o = oracle.get(_cell(r))
        kl, okl = r.get("kl_mean"), (o or {}).get("kl_mean")
        ppl, oppl = r.get("ppl_sparse"), (o or {}).get("ppl_sparse")
        out.append(
            {
                **r,
                "variant": variant_label(r["config"]),
                "kl_oracle": okl,
                "kl_gap": None if kl is None or okl is None else kl - okl,
                "ppl_gap_pct": None if not ppl or not oppl else 100.0 * (ppl / oppl - 1.0),
                "selection_share": selection_share(r),
            }
        )
    return out


def format_frontier(rows: Iterable[dict[str, Any]]) -> str:
    """A plain table: one line per (variant, method, density), oracle first in each variant;
    `selection` is the cell's selection time over the dense model's attention time."""
    ranked = distance_to_oracle(rows)
    w = max([11] + [len(r["method"]) for r in ranked])  # xattention-threshold is 20
    lines = [
        f"{'variant':12s} {'method':{w}s} {'target':>6s} {'achieved':>8s} {'KL':>7s} "
        f"{'top-1':>6s} {'ppl':>14s} {'KL-oracle':>9s} {'selection':>9s}"
    ]
    ranked = sorted(
        ranked,
        key=lambda r: (
            r["length"],
            r["config"].get("block_size"),
            r["variant"],
            r["density_target"],
            r["method"] != "oracle",
            r["method"],
        ),
    )

    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    for r in ranked:
        ppl = f"{f(r['ppl_dense'], '.2f')}->{f(r['ppl_sparse'], '.2f')}"
        lines.append(
            f"{r['variant']:12s} {r['method']:{w}s} {r['density_target']:6.2f} "
            f"{f(r['density_achieved'], '8.3f')} {f(r['kl_mean'], '7.4f')} "
            f"{f(r['top1_agreement'], '6.3f')} {ppl:>14s} {f(r['kl_gap'], '+9.4f')} "
            f"{f(r['selection_share'], '9.1%')}"
        )
    return "\n".join(lines)

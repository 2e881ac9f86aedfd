"""The quality-against-cost frontier as a picture: `sketchwalk frontier --json` rows drawn as KL
against the selection's share of dense attention time, the exact-mass oracle as a line.

    sketchwalk frontier --lengths 2048 --json ... > a.json   # one file per configuration
    python -m sketchwalk.eval.frontier_svg a.json b.json --out docs/frontier-2k.svg

A plain SVG (no plotting stack, so it renders on GitHub and in any browser); the target box is
the region of issue-style targets (selection share at most `--max-share`, KL at most
`--max-kl-ratio` x the oracle's).
"""

from __future__ import annotations

import argparse
import json
from html import escape
from pathlib import Path
from typing import Any

from sketchwalk.engine.method.config import default_of, knobs

# knobs worth naming in a point's label, by their short names
SHORT = {
    "block_size": "b",
    "query_samples": "q",
    "score_rank": "rank ",
    "pool": "",
    "estimator": "",
    "sampled_depth": "depth ",
}
W, H, PAD = 620, 440, 60  # the plot; the legend of numbered points sits right of it
LEGEND = 320


def knob_label(config: dict[str, Any]) -> str:
    """What sets a configuration apart from the defaults, shortly ("defaults" when nothing)."""
    defaults = {f.name: default_of(f) for f, _ in knobs()}
    parts = [
        f"{SHORT[k]}{config[k]}"
        for k in SHORT
        if k in config and k in defaults and config[k] != defaults[k]
    ]
    return " ".join(parts) or "defaults"


def points(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float | None]:
    """(one point per non-oracle row: label, share, KL), the oracle's KL (the first seen)."""
    pts, oracle = [], None
    for r in rows:
        if r.get("kl_mean") is None:
            continue
        if r["method"] == "oracle":
            oracle = oracle if oracle is not None else float(r["kl_mean"])
            continue
        if r.get("selection_share") is None:
            continue
        name = r.get("label") or (
            r["method"] if r["method"] != "sketchwalk" else knob_label(r["config"])
        )
        pts.append({"label": name, "share": float(r["selection_share"]), "kl": float(r["kl_mean"])})
    return pts, oracle


def frontier_svg(
    rows: list[dict[str, Any]],
    max_share: float = 0.10,
    max_kl_ratio: float = 1.1,
    title: str = "",
    x_label: str = "selection time / dense attention time",
) -> str:
    """The picture of `rows` (frontier rows with selection_share) as an SVG document; x_label
    names what selection_share holds (a timed share, or a counted one)."""
    pts, oracle = points(rows)
    if not pts:
        raise ValueError("no frontier rows with a KL and a selection share to draw")
    xmax = max(0.1, max(p["share"] for p in pts)) * 1.1
    ymax = max(p["kl"] for p in pts) * 1.15
    sx = lambda v: PAD + (W - 2 * PAD) * v / xmax  # noqa: E731
    sy = lambda v: H - PAD - (H - 2 * PAD) * v / ymax  # noqa: E731
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W + LEGEND}" height="{H}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{W + LEGEND}" height="{H}" fill="white"/>',
        f'<text x="{(W + LEGEND) / 2}" y="20" text-anchor="middle" font-size="14">'
        f"{escape(title)}</text>",
    ]
    if oracle is not None:  # the target region, then the oracle's line
        top = oracle * max_kl_ratio
        out.append(
            f'<rect x="{sx(0)}" y="{sy(top)}" width="{sx(max_share) - sx(0)}" '
            f'height="{sy(0) - sy(top)}" fill="#009E73" fill-opacity="0.12"/>'
        )
        out.append(
            f'<line x1="{sx(0)}" x2="{sx(xmax)}" y1="{sy(oracle)}" y2="{sy(oracle)}" '
            'stroke="#009E73" stroke-dasharray="4 3"/>'
        )
        out.append(
            f'<text x="{sx(0) + 4}" y="{sy(oracle) + 14}" fill="#009E73">'
            f"exact-mass oracle KL {oracle:.4f}</text>"
        )
    out.append(  # axes
        f'<path d="M{sx(0)},{sy(0)} H{sx(xmax)} M{sx(0)},{sy(0)} V{sy(ymax)}" stroke="black"/>'
    )
    for i in range(6):
        xv, yv = xmax * i / 5, ymax * i / 5
        out.append(f'<text x="{sx(xv)}" y="{sy(0) + 16}" text-anchor="middle">{xv:.0%}</text>')
        out.append(f'<text x="{sx(0) - 6}" y="{sy(yv) + 4}" text-anchor="end">{yv:.3f}</text>')
    out.append(f'<text x="{W / 2}" y="{H - 18}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(
        f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">'
        "KL(dense || sparse)</text>"
    )
    # points numbered by KL, named in the legend (labels in a dense cluster would collide)
    for i, p in enumerate(sorted(pts, key=lambda p: (p["kl"], p["share"])), 1):
        x, y = sx(p["share"]), sy(p["kl"])
        colour = "#D55E00" if p["label"].startswith("defaults") else "#0072B2"
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{x + 5:.1f}" y="{y - 5:.1f}" font-size="10">{i}</text>')
        out.append(
            f'<text x="{W + 10}" y="{PAD + 16 * i}" fill="{colour}">{i}. {escape(p["label"])} '
            f"({p['kl']:.4f}, {p['share']:.0%})</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="JSON files of `sketchwalk frontier --json`")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--title", default="")
    p.add_argument("--max-share", type=float, default=0.10)
    p.add_argument("--max-kl-ratio", type=float, default=1.1)
    p.add_argument("--x-label", default="selection time / dense attention time")
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    try:
        for f in args.files:
            data = json.loads(f.read_text())
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise ValueError(f"{f}: not a list of frontier rows")
            rows.extend(data)
        svg = frontier_svg(rows, args.max_share, args.max_kl_ratio, args.title, args.x_label)
    except (OSError, ValueError, KeyError) as exc:
        p.exit(2, f"frontier_svg: error: {exc}\n")
    args.out.write_text(svg)


if __name__ == "__main__":
    main()

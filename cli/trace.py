"""`sketchwalk trace RUN_ID --text TEXT`: follow a needle's blocks through a stored run.

RUN_ID may be the first characters of an id (the app shows 8): one matching run, else one line.

Prints, per phase, layer and decode step, the blocks holding the text, whether each was kept,
the exact attention mass they got (where recorded) and their rank in the selecting scores;
`--json` prints one JSON object instead. A text that is not in the prompt is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json

from sketchwalk.store import open_store
from sketchwalk.store.needle import NeedleTrace, trace


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("trace", help="follow a needle (a text in the prompt) through a run")
    p.add_argument(
        "run_id", metavar="RUN_ID", help="a run id, or its first characters (the app shows 8)"
    )
    p.add_argument(
        "--text", required=True, help="text to find in the run's prompt, e.g. a pass key"
    )
    p.add_argument(
        "--db",
        metavar="URL",
        help="database URL or DuckDB file (default: $SKETCHWALK_DB, else "
        "~/.local/share/sketchwalk/sketchwalk.duckdb)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    with open_store(args.db) as store:
        result = trace(store, store.resolve_run_id(args.run_id), args.text)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print_table(result)
    return 0


def _fmt(x: object, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(t: NeedleTrace) -> None:
    n = t.needle
    spans = ", ".join(f"t{s}-{e - 1}" for s, e in n.spans)
    print(f"run {t.run_id}  needle {n.text!r}  tokens {spans}  blocks {n.blocks}")
    print(f"{'phase':<10} {'layer':>5}  {'block':>6}  {'kept':<5} {'rank':>5}  mass share")
    for s in t.steps:
        for i, (b, k, r) in enumerate(zip(s.blocks, s.kept, s.ranks, strict=True)):
            kept = "dense" if s.dense else ("yes" if k else "NO")
            mass = _fmt(s.mass, ".4f") if i == 0 else ""
            print(
                f"{s.label:<10} {s.layer:>5}  {'B' + str(b):>6}  {kept:<5} {_fmt(r, 'd'):>5}  {mass}"
            )
    print(t.sentence())

"""`sketchwalk frontier`: every method beside the exact-mass oracle, per block size and
granularity, at the same densities; the distance to the oracle is what an estimator leaves."""

from __future__ import annotations

import argparse
import json
import sys
import uuid

from sketchwalk.cli import flags
from sketchwalk.cli.eval import add_model_args, add_rope_arg, grid_progress, rope_scale
from sketchwalk.cli.knobs import add_config_args, config_from_args
from sketchwalk.errors import SketchWalkError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "frontier",
        help="quality vs density of every method beside the exact-mass oracle",
        description=(
            "Teacher-forced KL, top-1 agreement and perplexity against the dense model for the "
            "exact-mass oracle and each method, at every block size and selection granularity "
            "(one selection per layer or per KV-head group), at the same target densities. "
            "Rows are stored like eval rows (the Benchmarks page shows the distance to the "
            "oracle)."
        ),
    )
    add_model_args(p)
    add_rope_arg(p)
    p.add_argument(
        "--tasks",
        type=flags.text_list("--tasks"),
        default="lm:gpl-3",
        help="task specs as for `sketchwalk eval` (default lm:gpl-3)",
    )
    lists = {
        "--lengths": ("2048", "comma-separated prompt lengths in tokens"),
        "--methods": ("sketchwalk,nowalk,streaming", "methods beside the oracle"),
        "--densities": ("0.2", "comma-separated target densities"),
        "--blocks": ("16,32,64", "comma-separated block sizes"),
        "--granularity": ("layer,group", "layer, group or both"),
    }
    for flag, (default, help_text) in lists.items():
        p.add_argument(flag, type=flags.text_list(flag), default=default, help=help_text)
    p.add_argument(
        "--max-chunks", type=flags.count("--max-chunks", 1, 1_000_000), default=1,
        help="chunks per document (default 1)",
    )  # fmt: skip
    p.add_argument("--db", metavar="URL", help="store URL or DuckDB file (default: $SKETCHWALK_DB)")
    p.add_argument("--no-store", action="store_true", help="do not write the rows to the store")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_config_args(p, exclude=("method", "density", "block_size", "per_group", "phases"))
    p.set_defaults(func=cmd_frontier)


def build(args: argparse.Namespace):
    """Everything validated before the model loads: (spec, tasks, lengths)."""
    from sketchwalk.cli.eval import _floats, _ints, _methods
    from sketchwalk.eval.frontier import frontier_spec
    from sketchwalk.eval.grid import configs
    from sketchwalk.eval.items import parse_tasks

    if args.max_chunks < 1:
        raise SketchWalkError(f"--max-chunks must be at least 1, got {args.max_chunks}")
    base = config_from_args(args).to_dict()
    for name in ("method", "density", "block_size", "per_group", "phases", "extra"):
        base.pop(name)
    spec = frontier_spec(
        _methods(args.methods),
        _floats(args.densities, "densities", 0.0, 1.0, lo_open=True),
        _ints(args.blocks, "blocks", hi=4096),
        [g.strip() for g in args.granularity.split(",") if g.strip()],
        base,
    )
    configs(spec)  # bad knobs (a block size that is no power of two) fail here
    rope_scale(args)  # a bad --rope-scale fails before the model loads
    tasks = parse_tasks(args.tasks)
    if any(task != "lm" and task != "file" for task, _ in tasks):
        raise SketchWalkError("the frontier scores language modelling: use lm:SOURCE or file:PATH")
    return spec, tasks, _ints(args.lengths, "lengths")


def cmd_frontier(args: argparse.Namespace) -> int:
    spec, tasks, lengths = build(args)
    from sketchwalk.engine.run.models import load_model
    from sketchwalk.eval.frontier import distance_to_oracle, format_frontier
    from sketchwalk.eval.grid import run_grid
    from sketchwalk.eval.items import build_items
    from sketchwalk.store import open_store

    if not args.no_store:
        open_store(args.db).close()  # a locked or foreign store fails now, not after the grid
    lm = load_model(args.model, args.dtype, args.device, rope_scale(args))
    too_long = [n for n in lengths if n > lm.max_context]
    if too_long:
        raise SketchWalkError(
            f"--lengths {too_long[0]} exceeds {lm.model_id}'s context of {lm.max_context} tokens"
        )
    items = build_items(lm.tokenizer, tasks, lengths, (), 1, 0, args.max_chunks, lm.max_context)
    if not items:
        raise SketchWalkError("the tasks produced no prompts (texts shorter than half a length?)")
    eval_id = str(uuid.uuid4())
    with grid_progress("frontier") as progress:
        rows = run_grid(lm, items, spec, eval_id, progress)
    for row in rows:
        row["extra"]["frontier"] = True
        if args.rope_scale:
            row["extra"]["rope_scale"] = rope_scale(args).label
    if not args.no_store:
        with open_store(args.db) as store:
            store.save_eval_results(rows)
    if args.json:
        print(json.dumps(distance_to_oracle(rows), default=str))
    else:
        print(format_frontier(rows))
    print(f"frontier {eval_id}: {len(rows)} rows", file=sys.stderr)
    return 0

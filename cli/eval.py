"""`sketchwalk eval`: quality against density for several methods, on offline tasks, in one grid.

Every cell is stored (table eval_results, read by the Benchmarks page), printed as a table, and
plotted (interactive HTML always; PNG when kaleido and a Chrome are available).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import uuid
from datetime import datetime
from pathlib import Path

from sketchwalk.cli import flags
from sketchwalk.cli.knobs import add_config_args, config_from_args
from sketchwalk.errors import SketchWalkError
from sketchwalk.kernels.backends import REGISTRY


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="quality vs density of several methods on offline tasks (stored, tabled, plotted)",
        description=(
            "Runs every item of the tasks through the dense model once and through every "
            "(method, density), compares them (perplexity and KL vs dense, exact-match retrieval "
            "accuracy after greedy decoding), stores one row per cell, prints a table and writes "
            "quality-vs-density plots. Tasks: lm[:SOURCE] (offline long text: gpl-3, gpl-2, "
            "lgpl-2.1, apache-2.0, mpl-2.0, python-stdlib, and long-prose / long-code for 16k-32k "
            "with --rope-scale; chunked to each length), "
            "retrieval[:passkey|kv|passkey-varied|passkey-heldout] (seeded synthetic needle / "
            "key-value prompts of each length; a bare retrieval runs passkey and kv; the varied "
            "pass keys have other fillers, keys and wordings, the held-out set is never tuned "
            "on), "
            'file:PATH (a text file, chunked like lm, or a .jsonl of {"prompt", "answer"}).'
        ),
    )
    add_model_args(p)
    add_rope_arg(p)
    p.add_argument(
        "--methods",
        type=flags.text_list("--methods"),
        default=None,
        help="comma-separated methods (default: every registered sparse method)",
    )
    p.add_argument(
        "--densities",
        type=flags.text_list("--densities"),
        default="0.1,0.2,0.3,0.5",
        help="comma-separated targets",
    )
    p.add_argument(
        "--tasks",
        type=flags.text_list("--tasks"),
        default="lm,retrieval",
        help="comma-separated task specs",
    )
    p.add_argument(
        "--lengths",
        type=flags.text_list("--lengths"),
        default="2048",
        help="comma-separated prompt / chunk lengths in tokens",
    )
    p.add_argument(
        "--depths",
        type=flags.text_list("--depths"),
        default="0.1,0.5,0.9",
        help="retrieval needle depths in [0, 1]",
    )
    p.add_argument(
        "--per-depth", type=flags.count("--per-depth", 1, 10_000), default=1,
        help="retrieval prompts per depth",
    )  # fmt: skip
    p.add_argument(
        "--seed", type=flags.count("--seed", 0, (1 << 32) - 1), default=0,
        help="retrieval generator seed",
    )  # fmt: skip
    p.add_argument(
        "--max-chunks", type=flags.count("--max-chunks", 1, 1_000_000), default=None,
        help="at most N chunks per document",
    )  # fmt: skip
    p.add_argument(
        "--new-tokens", type=flags.count("--new-tokens", 1, 1 << 16), default=8,
        help="greedy tokens for answered items",
    )  # fmt: skip
    p.add_argument("--backend", default=None, choices=list(REGISTRY))
    p.add_argument("--db", metavar="URL", help="store URL or DuckDB file (default: $SKETCHWALK_DB)")
    p.add_argument("--no-store", action="store_true", help="do not write the rows to the store")
    p.add_argument("--out", metavar="DIR", help="folder for table, JSON, Parquet, HTML and PNG")
    p.add_argument("--no-png", action="store_true", help="skip the PNG plots (HTML only)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    add_config_args(p, exclude=("method", "density", "seed"))  # --seed: the task generator
    from sketchwalk.eval.ray_grid import add_ray_argument

    add_ray_argument(p)  # --ray [ADDRESS]: run the grid as Ray tasks (absent: locally)
    p.set_defaults(func=cmd_eval)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, --dtype, --device: the model a grid runs on (eval, frontier)."""
    flags.add_model(p, "smollm2", "model id or folder (default: smollm2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    flags.add_device(p, help="cpu or cuda[:N]")


def add_rope_arg(p: argparse.ArgumentParser) -> None:
    """--rope-scale: run the model RoPE-scaled past its trained context (eval, frontier)."""
    p.add_argument(
        "--rope-scale",
        metavar="[TYPE:]FACTOR",
        default=None,
        help="RoPE-scale the model to FACTOR x its trained context (TYPE yarn, the default, or "
        "linear; e.g. yarn:4 takes SmolLM2 to 32k); sparse and dense are the same scaled model",
    )


def rope_scale(args: argparse.Namespace):
    """The parsed --rope-scale (None without one); a bad one is a one-line error."""
    from sketchwalk.engine.run.models import parse_rope_scale

    return parse_rope_scale(getattr(args, "rope_scale", None))


@contextlib.contextmanager
def grid_progress(desc: str):
    """A tqdm bar on stderr (percent done) driven by a grid's Progress callback."""
    from tqdm import tqdm

    with tqdm(total=100, desc=desc, unit="%", file=sys.stderr) as bar:

        def progress(fraction: float, msg: str) -> None:
            bar.set_postfix_str(msg[-40:], refresh=False)
            bar.update(round(100 * fraction) - bar.n)

        yield progress


def _floats(text: str, what: str, lo: float, hi: float, lo_open: bool) -> tuple[float, ...]:
    out = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        try:
            v = float(part)
        except ValueError:
            raise SketchWalkError(
                f"--{what} takes comma-separated numbers, got {flags.shown(part)}"
            ) from None
        bad = math.isnan(v) or v > hi or (v <= lo if lo_open else v < lo)
        if bad:
            rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
            raise SketchWalkError(f"--{what} values must be in {rng}, got {part}")
        out.append(v)
    if not out:
        raise SketchWalkError(f"--{what} is empty")
    return tuple(dict.fromkeys(out))


def _ints(text: str, what: str, hi: int = flags.MAX_TOKENS) -> tuple[int, ...]:
    out = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        try:
            v = int(part) if len(part) <= 40 else None
        except ValueError:
            v = None
        if v is None:
            raise SketchWalkError(
                f"--{what} takes comma-separated integers, got {flags.shown(part)}"
            ) from None
        if not 1 <= v <= hi:
            raise SketchWalkError(f"--{what} values must be in 1..{hi}, got {v}")
        out.append(v)
    if not out and what != "dense-layers":
        raise SketchWalkError(f"--{what} is empty")
    return tuple(dict.fromkeys(out))


def _methods(text: str | None) -> tuple[str, ...]:
    from sketchwalk.engine.method.methods import names

    allowed = names(sparse_only=True)
    if text is None:
        return allowed
    picked = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    for m in picked:
        if m == "dense":
            raise SketchWalkError("dense is the reference every row is compared with; drop it")
        if m not in allowed:
            raise SketchWalkError(f"unknown method {m!r}; choose from {', '.join(allowed)}")
    if not picked:
        raise SketchWalkError("--methods is empty")
    return picked


def build(args: argparse.Namespace):
    """Everything validated before the model loads: (spec, tasks, lengths, depths)."""
    from sketchwalk.eval.grid import GridSpec, configs
    from sketchwalk.eval.items import parse_tasks

    if args.per_depth < 1:
        raise SketchWalkError(f"--per-depth must be at least 1, got {args.per_depth}")
    if args.max_chunks is not None and args.max_chunks < 1:
        raise SketchWalkError(f"--max-chunks must be at least 1, got {args.max_chunks}")
    if args.new_tokens < 1:
        raise SketchWalkError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    base = config_from_args(args).to_dict()
    for name in ("method", "density", "extra"):
        base.pop(name)
    spec = GridSpec(
        methods=_methods(args.methods),
        densities=_floats(args.densities, "densities", 0.0, 1.0, lo_open=True),
        phases=base.pop("phases"),
        new_tokens=args.new_tokens,
        base=base,
        kernel_backend=args.backend,
    )
    configs(spec)  # bad knobs fail here, before minutes of model work
    tasks = parse_tasks(args.tasks)
    lengths = _ints(args.lengths, "lengths")
    depths = _floats(args.depths, "depths", 0.0, 1.0, lo_open=False)
    if rope_scale(args) is not None and args.ray is not None:
        raise SketchWalkError("--rope-scale runs locally: drop --ray")
    return spec, tasks, lengths, depths


def cmd_eval(args: argparse.Namespace) -> int:
    spec, tasks, lengths, depths = build(args)

    from sketchwalk.engine.run.models import load_model
    from sketchwalk.eval import report as eval_report
    from sketchwalk.eval.grid import run_grid
    from sketchwalk.eval.items import build_items
    from sketchwalk.store import open_store

    if not args.no_store:
        open_store(args.db).close()  # a locked or foreign store fails now, not after the grid
    out = Path(args.out or f"sketchwalk-eval-{datetime.now():%Y%m%d-%H%M%S}").expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SketchWalkError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    # Under Ray the driver only needs the tokenizer and context; tasks pick their own device.
    device = "cpu" if args.ray is not None else args.device
    lm = load_model(args.model, args.dtype, device, rope_scale(args))
    too_long = [n for n in lengths if n > lm.max_context]
    if too_long:
        raise SketchWalkError(
            f"--lengths {too_long[0]} exceeds {lm.model_id}'s context of {lm.max_context} tokens"
        )
    items = build_items(
        lm.tokenizer,
        tasks,
        lengths,
        depths,
        args.per_depth,
        args.seed,
        args.max_chunks,
        lm.max_context - args.new_tokens,
    )
    if not items:
        raise SketchWalkError("the tasks produced no prompts (texts shorter than half a length?)")
    eval_id = str(uuid.uuid4())
    with grid_progress("eval") as progress:
        generator = {"generator": {"seed": args.seed, "depths": list(depths)}}
        if args.rope_scale:
            generator["rope_scale"] = rope_scale(args).label
        if args.ray is not None:
            from sketchwalk.eval.ray_grid import eval_grid_on_ray

            rows = eval_grid_on_ray(args, items, spec, eval_id, progress, extra=generator)
        else:
            rows = run_grid(lm, items, spec, eval_id, progress)
    for row in rows:
        row["extra"].update(generator)
    if not args.no_store and args.ray is None:  # Ray tasks already stored their rows
        with open_store(args.db) as store:
            store.save_eval_results(rows)
    files = _write_outputs(rows, out, eval_id, png=not args.no_png)
    if args.json:
        print(json.dumps(eval_report.with_derived(rows), indent=1, default=str))
    else:
        print(eval_report.format_table(rows))
        for (task, source, length), d in eval_report.within(rows, "sketchwalk").items():
            where = f"{d:g}" if d is not None else "no density in this grid"
            print(f"sketchwalk within 1% of dense perplexity on {task}/{source}/{length}: {where}")
    print(
        f"eval {eval_id}: {len(rows)} rows; wrote {', '.join(str(f) for f in files)}",
        file=sys.stderr,
    )
    return 0


def _write_outputs(rows: list[dict], out: Path, eval_id: str, png: bool) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sketchwalk.eval import report as eval_report
    from sketchwalk.store import jsonio

    files = []
    table = out / "table.txt"
    table.write_text(eval_report.format_table(rows) + "\n", encoding="utf-8")
    files.append(table)
    data = out / "results.json"
    data.write_text(jsonio.dumps(eval_report.with_derived(rows)) + "\n", encoding="utf-8")
    files.append(data)
    flat = [
        {k: (jsonio.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()} for r in rows
    ]
    pq.write_table(pa.Table.from_pylist(flat), out / "results.parquet")
    files.append(out / "results.parquet")
    try:
        files.append(
            eval_report.write_html(rows, out / "quality.html", f"sketchwalk eval {eval_id[:8]}")
        )
        if png:
            pngs, why = eval_report.write_pngs(rows, out)
            files += pngs
            if why:
                print(why, file=sys.stderr)
    except ImportError:
        print("plots skipped: plotly is not installed (pip install plotly)", file=sys.stderr)
    return files

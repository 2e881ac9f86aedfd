"""Store commands: `sketchwalk runs`, `export`, `import`, `delete`.

Thin wrappers over sketchwalk.store; every failure a user can fix is a StoreError, which the CLI
prints as one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from sketchwalk.errors import SketchWalkError
from sketchwalk.store import open_store
from sketchwalk.text import terminal_safe


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        help="database URL or DuckDB file (default: $SKETCHWALK_DB, else "
        "~/.local/share/sketchwalk/sketchwalk.duckdb)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("runs", help="list stored runs, newest first")
    _add_db(p)
    p.add_argument("--status", choices=("queued", "running", "done", "failed"))
    p.add_argument("--model", help="only runs of this model id")
    p.add_argument("--method", help="only runs of this method")
    p.add_argument("--limit", type=int, help="at most this many runs")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_runs)

    p = subparsers.add_parser("export", help="write runs as Parquet files (or one zip)")
    _add_db(p)
    p.add_argument("run_ids", nargs="*", metavar="RUN_ID")
    p.add_argument("--all", action="store_true", help="export every run")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write into")
    p.add_argument(
        "--zip",
        action="store_true",
        help="write one zip instead (DIR/sketchwalk-export.zip, or --out itself if it ends .zip)",
    )
    p.add_argument("--json", action="store_true", help="print the written paths as JSON")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser("import", help="load a Parquet export (folder or zip) into the store")
    _add_db(p)
    p.add_argument("path", metavar="PATH", help="export folder, its manifest.json, or a zip")
    p.add_argument(
        "--skip-existing",
        action="store_true",
        help="leave runs already in the store as they are (default: refuse the import)",
    )
    p.add_argument("--json", action="store_true", help="print the imported run ids as JSON")
    p.set_defaults(func=cmd_import)

    p = subparsers.add_parser("delete", help="delete runs and every row that belongs to them")
    _add_db(p)
    p.add_argument("run_ids", nargs="+", metavar="RUN_ID")
    p.set_defaults(func=cmd_delete)


def _short(text: object, width: int) -> str:
    s = " ".join(str(text).split()) if text is not None else ""
    s = terminal_safe(s)
    return s if len(s) <= width else s[: width - 1] + "…"


def cmd_runs(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise SketchWalkError(f"--limit must be 0 or more, got {args.limit}")
    from sketchwalk.worker.lifecycle import recover_dead_runs

    with open_store(args.db) as store:
        recover_dead_runs(store)
        df = store.list_runs(
            status=args.status, model=args.model, method=args.method, limit=args.limit
        )
    if args.json:
        records = json.loads(df.to_json(orient="records", date_format="iso"))
        print(json.dumps(records, indent=2))
        return 0
    if df.empty:
        print("no runs stored")
        return 0
    rows = [
        [
            str(r.id),
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            str(r.status),
            _short(r.model_id, 32),
            _short(r.method, 12),
            "" if pd.isna(r.prompt_tokens) else str(int(r.prompt_tokens)),
            _short(r.prompt, 40),
        ]
        for r in df.itertuples()
    ]
    header = ["id", "created (UTC)", "status", "model", "method", "tokens", "prompt"]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for line in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.all == bool(args.run_ids):
        raise SketchWalkError("give run ids to export, or --all (not both)")
    run_ids = None if args.all else args.run_ids
    out = Path(args.out).expanduser()
    with open_store(args.db) as store:
        if args.zip:
            target = out if out.suffix == ".zip" else out / "sketchwalk-export.zip"
            store.export_ids(run_ids)  # unknown runs refused before a file is created
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as stream:
                    store.write_zip(run_ids, stream)
            except BaseException as exc:  # a full disk, or an interrupt: no partial zip is left
                target.unlink(missing_ok=True)
                if isinstance(exc, OSError):
                    raise SketchWalkError(
                        f"cannot write {target}: {exc.strerror or exc}; choose a writable --out"
                    ) from None
                raise
            paths = [target]
        else:
            paths = store.export_parquet(run_ids, out)
    if args.json:
        print(json.dumps([str(p) for p in paths]))
    else:
        for p in paths:
            print(p)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    with open_store(args.db) as store:
        ids = store.import_parquet(args.path, skip_existing=args.skip_existing)
    if args.json:
        print(json.dumps(ids))
    else:
        print(f"imported {len(ids)} run(s)" + (": " + ", ".join(ids) if ids else ""))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """One transaction for the whole list (an unknown id deletes nothing). SIGINT and SIGTERM
    raise Interrupted here; the line it carries says how many runs are gone, read back from the
    store after the transaction ended (committed or rolled back)."""
    from sketchwalk.worker.lifecycle import Interrupted, shielded, signals_interrupt

    ids = list(dict.fromkeys(args.run_ids))
    with signals_interrupt(), open_store(args.db) as store:
        try:
            store.delete_runs(ids)
            print(f"deleted {len(ids)} run(s)", file=sys.stdout)
        except Interrupted as exc:
            with shielded():
                line = _deleted_line(store, ids)
            raise Interrupted(exc.signum, line) from None
    return 0


def _deleted_line(store, ids: list[str]) -> str:
    """What an interrupted delete left: none or all of `ids` (one transaction), read back."""
    try:
        left = set(store.run_ids()) & set(ids)
    except Exception:  # the store is gone too: say what is known
        return (
            f"the delete of {len(ids)} run(s) was stopped; see `sketchwalk runs` for what is left"
        )
    if not left:
        return f"all {len(ids)} run(s) were deleted before it stopped"
    if len(left) == len(ids):
        return f"no run was deleted (the {len(ids)} run(s) are deleted in one transaction)"
    return f"{len(ids) - len(left)} of {len(ids)} run(s) were deleted"

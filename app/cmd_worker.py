"""`sketchwalk worker`: serve the job queue from the command line, outside the app.

For a server database (PostgreSQL), run one per device next to an app started with --no-worker.
A DuckDB file the app already holds cannot be opened here (one process per file): the store's
lock error says so.
"""

from __future__ import annotations

import argparse
import logging
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="take queued runs from a store's job table and run them")
    p.add_argument(
        "--db",
        default=None,
        help="store URL or DuckDB file (default $SKETCHWALK_DB or the user data dir)",
    )
    p.add_argument("--device", default=None, help="cpu (default) or cuda:N")
    p.add_argument("--once", action="store_true", help="run the queued jobs, then exit")
    p.add_argument("--name", default=None, help="worker name (default worker@HOST/DEVICE)")
    p.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from sketchwalk.app.settings import load
    from sketchwalk.app.worker import Worker, recover, worker_name
    from sketchwalk.store import open_store

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    settings = load()
    device = args.device or settings.device
    name = args.name or worker_name(device, kind="worker")
    store = open_store(args.db)  # StoreLockedError (one line) when the app holds the file
    try:
        recovered = recover(store, name)
        if recovered:
            print(f"sketchwalk: marked {len(recovered)} interrupted job(s) failed", file=sys.stderr)
        worker = Worker(store, settings, name=name, device=device)
        if args.once:
            done = worker.drain()
            failed = [j for j in done if store.get_job(j).status == "failed"]
            print(f"sketchwalk: ran {len(done)} job(s), {len(failed)} failed", file=sys.stderr)
            return 1 if failed else 0
        print(f"sketchwalk: worker {name} serving {store.url} (Ctrl-C to stop)", file=sys.stderr)
        worker.serve()
    finally:
        store.close()
    return 0

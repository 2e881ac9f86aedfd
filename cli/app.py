"""`sketchwalk app`: start the Streamlit explorer (and its in-process worker) on a store."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

# The app package is found, not imported (importing it would import Streamlit).
ENTRY = Path(importlib.util.find_spec("sketchwalk.app").origin).with_name("streamlit_app.py")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("app", help="open the explorer app (Streamlit) on a run store")
    p.add_argument(
        "--db",
        default=None,
        help="store URL or DuckDB file (default $SKETCHWALK_DB or the user data dir)",
    )
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    p.add_argument("--host", default="localhost", help="address to bind (0.0.0.0 to serve others)")
    p.add_argument(
        "--device", default=None, help="where the in-app worker runs models (cpu, cuda:0)"
    )
    p.add_argument(
        "--no-worker",
        action="store_true",
        help="run no in-app worker (standalone workers serve jobs)",
    )
    p.set_defaults(func=cmd_app)


def streamlit_argv(port: int, host: str) -> list[str]:
    """The `streamlit run` command line: headless, no usage stats, no file watcher, and no full
    garbage collection after every script run: with torch and transformers loaded, gc.collect(2)
    holds the GIL for a long time, and the progress panel reruns every poll interval, so the
    in-app worker thread crawled (a tiny-model job: minutes instead of seconds). Uploads may be
    as large as an import allows a file (SKETCHWALK_IMPORT_MAX_MB; Streamlit's own cap is 200)."""
    from sketchwalk.settings import load

    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ENTRY),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={host}",
        "--server.fileWatcherType=none",
        "--runner.postScriptGC=false",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=minimal",
        f"--server.maxUploadSize={load().import_max_member_mb}",
    ]


def cmd_app(args: argparse.Namespace) -> int:
    from sketchwalk.errors import SketchWalkError
    from sketchwalk.store import open_store, resolve_url

    if not 0 < args.port < 65536:
        raise SketchWalkError(f"--port must be in 1..65535, got {args.port}")
    url = resolve_url(args.db)
    open_store(url).close()  # a locked or foreign database fails here, with one clear line
    env = dict(os.environ, SKETCHWALK_DB=url, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    env.setdefault("SKETCHWALK_WARM_MODEL", "1")  # the model loads while the page opens
    if args.device:
        env["SKETCHWALK_DEVICE"] = args.device
    if args.no_worker:
        env["SKETCHWALK_APP_WORKER"] = "0"
    print(
        f"sketchwalk: serving the explorer on http://{args.host}:{args.port} (store {url})",
        file=sys.stderr,
    )
    sys.stderr.flush()
    argv = streamlit_argv(args.port, args.host)
    os.execve(argv[0], argv, env)  # streamlit takes over this process (signals go straight to it)
    return 0  # unreachable

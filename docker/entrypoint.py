"""Container entry point: turn the container's role and environment into a `sketchwalk` command.

    entrypoint.py app            the explorer on 0.0.0.0:$SKETCHWALK_PORT (default 8501)
    entrypoint.py worker         a standalone worker on $SKETCHWALK_DEVICE (cpu, cuda:0)
    entrypoint.py healthcheck    exit 0 when the app answers on /_stcore/health (HEALTHCHECK)
    entrypoint.py runs --json    any other sketchwalk command (run, runs, eval, export, ...)
    entrypoint.py bash           anything else runs as given

Why a script and not a plain CMD: a server database (the compose file's PostgreSQL) is often not
accepting connections yet when the app and the workers start, and several of them would race to
create the schema. Before `app` and `worker` this waits for the store to open (which creates or
upgrades the schema on first use, serialized by the store) for up to $SKETCHWALK_DB_WAIT_S
seconds. Then it replaces itself with the command (exec), so signals (SIGTERM from `docker stop`)
reach sketchwalk directly. Plain Python with no imports of ours at module level, so the tests
load it from its path.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

SKETCHWALK_COMMANDS = (
    "run",
    "runs",
    "export",
    "import",
    "delete",
    "bench",
    "eval",
    "app",
    "worker",
)
EMBEDDED = ("duckdb", "sqlite")
FALSY = ("0", "false", "no", "off")


def fail(message: str) -> SystemExit:
    """One line on stderr; the caller raises the returned SystemExit (exit code 2)."""
    print(f"entrypoint: error: {message}", file=sys.stderr, flush=True)
    return SystemExit(2)


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    return default if not raw else raw not in FALSY


def build_argv(role: str, args: list[str], env: Mapping[str, str]) -> list[str]:
    """The command line a role runs, from the environment; extra `args` are appended."""
    exe = "sketchwalk"
    device = env.get("SKETCHWALK_DEVICE", "").strip()
    if role == "app":
        argv = [exe, "app", "--host", env.get("SKETCHWALK_HOST", "0.0.0.0")]
        argv += ["--port", env.get("SKETCHWALK_PORT", "8501")]
        if device:
            argv += ["--device", device]
        if not env_flag(env, "SKETCHWALK_APP_WORKER", True):
            argv.append("--no-worker")
        return argv + args
    if role == "worker":
        argv = [exe, "worker"]
        if device:
            argv += ["--device", device]
        grace = env.get("SKETCHWALK_STOP_GRACE_S", "").strip()
        if grace:
            argv += ["--grace", grace]
        return argv + args
    if role in SKETCHWALK_COMMANDS:
        return [exe, role, *args]
    return [role, *args]


def backend(url: str) -> str:
    """'postgresql', 'duckdb', ... of a store URL (a bare path is a DuckDB file)."""
    if "://" not in url:
        return "duckdb"
    return url.split("://", 1)[0].split("+", 1)[0].lower()


def safe_url(url: str) -> str:
    """The URL without its password, for messages (split at the last `@`: a password may
    hold one)."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def require_password(url: str, env: Mapping[str, str] | None = None) -> None:
    """A server database without a password is refused: in compose that means POSTGRES_PASSWORD
    was not set, and a default password would let anyone on the network into the store. The
    password may be in the URL or, as compose passes it, in SKETCHWALK_DB_PASSWORD."""
    if backend(url) != "postgresql":
        return
    if (env or {}).get("SKETCHWALK_DB_PASSWORD"):
        return
    from sketchwalk.store.errors import StoreError
    from sketchwalk.store.target import parse_url

    try:
        password = parse_url(url).password
    except StoreError:  # an unparsable URL: the store says so in one line when opened
        return
    if not password:
        raise fail(
            f"refusing to start: the database URL {safe_url(url)} has no password; set "
            "POSTGRES_PASSWORD (compose), SKETCHWALK_DB_PASSWORD, or put one in SKETCHWALK_DB"
        )


def wait_for_store(
    url: str,
    timeout_s: float,
    opener: Callable[[str], object] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> None:
    """Open the store until it works (schema created/upgraded on the way) or time runs out.

    Only a server database is waited for; an embedded file opens or fails at once. Errors that
    waiting cannot fix (someone else's database, another schema version) fail at once too.
    Raises SystemExit(2) after one line on stderr on failure.
    """
    if backend(url) in EMBEDDED:
        return
    if opener is None:
        from sketchwalk.store import open_store

        def opener(u: str) -> object:
            open_store(u).close()
            return None

    from sketchwalk.store.errors import SchemaVersionError, StoreCorruptError

    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            opener(url)
            if attempt > 1:
                log(f"entrypoint: store {safe_url(url)} ready after {attempt} attempts")
            return
        except (SchemaVersionError, StoreCorruptError) as exc:
            raise fail(str(exc)) from None
        except Exception as exc:
            last = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if time.monotonic() >= deadline:
                raise fail(
                    f"store {safe_url(url)} not reachable after {timeout_s:g} s: {last}"
                ) from None
            if attempt == 1:
                log(f"entrypoint: waiting for store {safe_url(url)} ({last})")
            sleep(1.0)


def healthcheck(env: Mapping[str, str], timeout_s: float = 3.0) -> int:
    """0 when the app's health endpoint answers 'ok', else 1 (the HEALTHCHECK contract)."""
    url = f"http://127.0.0.1:{env.get('SKETCHWALK_PORT', '8501')}/_stcore/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 0 if resp.status == 200 and resp.read().strip() == b"ok" else 1
    except (urllib.error.URLError, OSError):
        return 1


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    role, args = (argv[0], argv[1:]) if argv else ("app", [])
    if role == "healthcheck":
        return healthcheck(env)
    if role in ("app", "worker"):
        from sketchwalk.store import resolve_url

        url = resolve_url(env.get("SKETCHWALK_DB") or None)
        require_password(url, env)
        try:
            wait_s = float(env.get("SKETCHWALK_DB_WAIT_S", "60"))
        except ValueError:
            raise fail("SKETCHWALK_DB_WAIT_S must be a number of seconds") from None
        wait_for_store(url, wait_s)
    command = build_argv(role, args, env)
    os.execvpe(command[0], command, env)
    return 0  # unreachable


if __name__ == "__main__":
    sys.exit(main())

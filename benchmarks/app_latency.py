"""How long a person waits in the app: Run clicked -> the run's quality verdict on the New run
page -> a heatmap of it in Explore ("Open in Explore" clicked then: the run's records are stored
with its quality half) -> the verdict with its speed half, back on New run; then the same for
the same prompt at another density (--second-density), whose dense side is reused.

Starts `sketchwalk app` on a fresh DuckDB file, drives it with Chromium (Debian's, through
playwright, as tests/e2e does), submits one run with the page's defaults (SmolLM2, density 0.2,
32 new tokens, recording on, clean passes timed), and prints the waits. `--shot PNG` also saves
a picture of the verdict panel (the README's).
The model's one-time conversion is done before the clock starts (it is cached per machine).

    .venv/bin/python -m sketchwalk.benchmarks.app_latency --prompt-file FILE [--shot PNG]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("app_latency: the app exited")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("app_latency: the app did not start")


def _wait_run(page: Page, args: argparse.Namespace, density: float) -> tuple[float, float, float]:
    """Click Run; seconds to the quality verdict (its target density shown: until then the panel
    shows an earlier run's), to a heatmap in Explore ("Open in Explore" clicked then: the run's
    records are stored with its quality half) and, back on New run, to the verdict with speed."""
    t0 = time.monotonic()
    page.get_by_role("button", name="Run", exact=True).click()
    verdict = page.locator(".st-key-nr_verdict")
    verdict.get_by_text(f"target {density:.2f}").first.wait_for()
    t_quality = time.monotonic() - t0
    page.get_by_role("button", name="Open in Explore").first.click()  # the newest run's
    page.locator(".js-plotly-plot .heatmaplayer").first.wait_for()
    t_map = time.monotonic() - t0
    if not args.no_clean_timing:  # the speed half: a prefill speed in x
        page.get_by_role("link", name="New run").first.click()
        page.locator(".st-key-nr_verdict").get_by_text("×").first.wait_for()
    return t_quality, t_map, time.monotonic() - t0


def _first_run(
    page: Page, url: str, prompt: str, args: argparse.Namespace
) -> tuple[float, float, float]:
    """Submit the prompt with the page's defaults: _wait_run's three waits."""
    page.goto(url)
    page.get_by_role("heading", name="New run").wait_for()
    area = page.get_by_label("Prompt", exact=True)
    area.fill(prompt)
    area.press("Control+Enter")
    page.get_by_text("tokens · limit").first.wait_for()
    page.wait_for_timeout(1500)
    if args.no_clean_timing:
        page.get_by_text("Also time a clean pass", exact=True).click()
        page.wait_for_timeout(1500)
    waits = _wait_run(page, args, 0.2)
    if args.shot:
        page.wait_for_timeout(1500)  # the panel's last rows settle
        page.locator(".st-key-nr_verdict").screenshot(path=args.shot)
    return waits


def _second_run(page: Page, args: argparse.Namespace) -> tuple[float, float, float]:
    """The same prompt at --second-density (the density slider moved key by key): _wait_run's
    three waits."""
    page.get_by_role("link", name="New run").first.click()
    slider = page.locator(".st-key-nr_density").get_by_role("slider")
    slider.wait_for()
    steps = round((0.2 - args.second_density) / 0.01)
    key = "ArrowLeft" if steps > 0 else "ArrowRight"
    for _ in range(abs(steps)):  # one key at a time, each re-rendered
        slider.press(key)
        page.wait_for_timeout(250)
    page.wait_for_timeout(1500)
    return _wait_run(page, args, args.second_density)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompt-file", required=True)
    ap.add_argument("--shot", default=None, help="save the verdict panel as this PNG")
    ap.add_argument(
        "--no-clean-timing",
        action="store_true",
        help="untick 'Also time a clean pass' (a verdict without speed, sooner)",
    )
    ap.add_argument(
        "--second-density",
        type=float,
        default=0.1,
        help="then run the same prompt at this density (0: no second run)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if not 0 <= args.second_density <= 1:
        print("app_latency: --second-density must lie in [0, 1]", file=sys.stderr)
        return 2
    if not Path(args.prompt_file).is_file():
        print(f"app_latency: no such prompt file: {args.prompt_file}", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    from sketchwalk.engine.run.models import load_model

    load_model()  # the one-time conversion stays out of the measurement
    prompt = Path(args.prompt_file).read_text()
    db = Path(tempfile.mkdtemp()) / "latency.duckdb"
    port = _free_port()
    url = f"http://localhost:{port}"
    script = Path(sys.executable).with_name("sketchwalk")
    proc = subprocess.Popen(
        [str(script), "app", "--db", str(db), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_healthy(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(1_800_000)
            first = _first_run(page, url, prompt, args)
            second = _second_run(page, args) if args.second_density else None
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for name, waits in (("first run", first), (f"same prompt at {args.second_density:g}", second)):
        if waits is not None:
            print(
                f"{name}: run clicked -> quality verdict {waits[0]:.1f} s; -> a heatmap in "
                f"Explore {waits[1]:.1f} s; -> verdict with speed {waits[2]:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

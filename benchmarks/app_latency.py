"""How long a person waits in the app: Run clicked -> the run's verdict (its quality half, then
its speed half) on the New run page -> first heatmap in Explore; then the same prompt at another
density (--second-density): Run -> its quality verdict (the dense side is reused) -> done.

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


def _first_run(
    page: Page, url: str, prompt: str, args: argparse.Namespace
) -> tuple[float, float, float]:
    """Submit the prompt with the page's defaults; seconds from Run clicked to the quality
    verdict, to the verdict with speed, and to the first heatmap in Explore."""
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
    t0 = time.monotonic()
    page.get_by_role("button", name="Run", exact=True).click()
    verdict = page.locator(".st-key-nr_verdict")
    verdict.locator('[data-testid="stMetricValue"]').first.wait_for()
    t_quality = time.monotonic() - t0
    if not args.no_clean_timing:  # the speed half: a prefill speed in x
        verdict.get_by_text("×").first.wait_for()
    t_done = time.monotonic() - t0
    if args.shot:
        page.wait_for_timeout(1500)  # the panel's last rows settle
        verdict.screenshot(path=args.shot)
    page.get_by_role("button", name="Open in Explore").first.click()
    page.locator(".js-plotly-plot .heatmaplayer").first.wait_for()
    return t_quality, t_done, time.monotonic() - t0


def _second_run(page: Page, args: argparse.Namespace) -> tuple[float, float]:
    """The same prompt at --second-density (the density slider moved key by key); seconds from
    Run clicked to its quality verdict and to the verdict with speed."""
    page.get_by_role("link", name="New run").first.click()
    slider = page.locator(".st-key-nr_density").get_by_role("slider")
    slider.wait_for()
    steps = round((0.2 - args.second_density) / 0.01)
    key = "ArrowLeft" if steps > 0 else "ArrowRight"
    for _ in range(abs(steps)):  # one key at a time, each re-rendered
        slider.press(key)
        page.wait_for_timeout(250)
    page.wait_for_timeout(1500)
    t1 = time.monotonic()
    page.get_by_role("button", name="Run", exact=True).click()
    verdict = page.locator(".st-key-nr_verdict")
    target = f"target {args.second_density:.2f}"
    verdict.get_by_text(target).first.wait_for()
    t2_quality = time.monotonic() - t1
    if not args.no_clean_timing:
        verdict.get_by_text("×").first.wait_for()
    return t2_quality, time.monotonic() - t1


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
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(1_800_000)
            t_quality, t_done, t_map = _first_run(page, url, prompt, args)
            second = _second_run(page, args) if args.second_density else None
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(
        f"run clicked -> quality verdict: {t_quality:.1f} s; -> verdict with speed: {t_done:.1f} s; "
        f"-> first heatmap in Explore: {t_map:.1f} s"
    )
    if second is not None:
        print(
            f"same prompt at density {args.second_density:g}: run clicked -> quality verdict: "
            f"{second[0]:.1f} s; -> verdict with speed: {second[1]:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End to end in a real browser: the app started as the README starts it, driven by Chromium.

Debian's chromium with Python playwright (never `playwright install`: no browser downloads here).
A run is submitted on a tiny model, explored, exported; an HTML-injection prompt must show as
text. Screenshots of every page land in artifacts/screenshots/.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sketchwalk.app import prompts

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
INJECTION = "<script>alert(1)</script><img src=x onerror=alert(2)>"
CHROME_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sketchwalk_cmd() -> list[str]:
    """The installed `sketchwalk` script next to this Python (as the README runs it)."""
    script = Path(sys.executable).with_name("sketchwalk")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sketchwalk.cli.main"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from tiny_models import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@contextlib.contextmanager
def serve_app(db, log_dir, **env: str):
    """`sketchwalk app` on a store, as a subprocess; yields its URL once it answers health."""
    port = free_port()
    log = open(log_dir / "app.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        [*sketchwalk_cmd(), "app", "--db", str(db), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, **env),
    )
    url = f"http://localhost:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read() == b"ok":
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            pytest.fail(f"the app did not start:\n{log.read()}")
        time.sleep(0.5)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("e2e") / "runs.duckdb"
    with serve_app(db, tmp_path_factory.mktemp("log"), SKETCHWALK_POLL_S="0.5") as url:
        yield url


def settle(page, timeout_ms: int = 60_000) -> None:
    """Wait until Streamlit finished the current script run (its status widget is gone)."""
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=timeout_ms)


def shot(page, name: str, height: int = 2400) -> None:
    """Streamlit scrolls inside its own container, so a tall viewport shows the whole page."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": height})
    page.wait_for_timeout(800)  # plotly re-lays out to the new size
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    page.set_viewport_size(size)


def goto_page(page, title: str, ready_text: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
    page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
    page.get_by_text(ready_text).first.wait_for(timeout=60_000)
    settle(page)


def test_submit_explore_export_in_a_real_browser(server, browser, tiny_model, tmp_path):
    dialogs: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.set_default_timeout(60_000)
    page.goto(server)

    # New run: model box = the tiny model folder, a prompt that tries to inject HTML
    page.get_by_role("heading", name="New run").wait_for(timeout=90_000)
    settle(page)
    model = page.get_by_label("Model", exact=True)
    model.fill(tiny_model)
    model.press("Enter")
    settle(page)
    prompt = f"{INJECTION}\n{prompts.license_text()[:2500]}"
    area = page.get_by_label("Prompt", exact=True)
    area.fill(prompt)
    area.press("Control+Enter")
    page.get_by_text("tokens · limit 4096 tokens for model").wait_for()
    settle(page)
    shot(page, "1-new-run")
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Job ").first.wait_for()
    page.get_by_text(": done").first.wait_for(timeout=180_000)
    settle(page)
    shot(page, "2-new-run-done")

    # Explore: the heatmaps are plotly figures in the DOM
    page.get_by_role("button", name="Open in Explore").click()
    page.get_by_role("heading", name="Explore").wait_for()
    page.locator(".js-plotly-plot").nth(3).wait_for()
    settle(page)
    assert page.locator(".js-plotly-plot").count() >= 4  # 3 matrices + the preview
    assert page.locator(".js-plotly-plot .heatmaplayer").count() >= 3
    # the default run does not walk (damping 0): its walk map is the counterfactual's, titled
    # as not used for selection, and the page says what the walk would change in the layer
    titles = page.locator(".js-plotly-plot .gtitle")
    assert titles.filter(has_text="not used for selection").count() == 1
    assert page.get_by_text("This run selected on A_l (walk damping 0)").count() == 1
    caption = page.get_by_text("data + figures").first
    assert caption.inner_text().startswith("Layer 2 ·")
    shot(page, "3-explore")

    # move the layer slider one step
    layer = page.locator('[data-testid="stSlider"]').filter(has_text="Layer").get_by_role("slider")
    layer.focus()
    layer.press("ArrowRight")
    page.get_by_text("Layer 3 ·").wait_for()
    settle(page)

    # preview another density (End = 1.00: every causal block kept)
    preview = (
        page.locator('[data-testid="stSlider"]')
        .filter(has_text="What would be kept")
        .get_by_role("slider")
    )
    preview.focus()
    preview.press("End")
    page.locator(".gtitle").filter(has_text="blocks kept at density 1.00").wait_for()
    settle(page)
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="Preview density")
    assert "1.000" in metric.inner_text()

    # the prompt shows literally, and nothing of it became HTML
    page.get_by_text("Prompt (as text)").click()
    shown = page.get_by_text(INJECTION).first
    shown.wait_for()
    assert shown.is_visible()
    assert page.locator('img[src="x"]').count() == 0
    assert page.locator("script", has_text="alert(1)").count() == 0
    shot(page, "4-explore-preview")
    shutil.copyfile(SHOTS / "4-explore-preview.png", tmp_path / "explore.png")

    # download the Parquet zip and read it back
    with page.expect_download(timeout=60_000) as dl:
        page.get_by_role("button", name="Download this run (Parquet zip)").click()
    data = Path(dl.value.path()).read_bytes()
    zf = zipfile.ZipFile(io.BytesIO(data))
    manifest = json.loads(zf.read("manifest.json"))
    assert len(manifest["run_ids"]) == 1
    runs = pq.read_table(io.BytesIO(zf.read("runs.parquet"))).to_pandas()
    assert runs["prompt"].tolist() == [prompt]
    scores = pq.read_table(io.BytesIO(zf.read("block_scores.parquet"))).to_pandas()
    assert len(scores) > 0 and {"walk", "selected", "exact"} <= set(scores.columns)

    # the other pages render too
    goto_page(page, "Compare", "Per-token KL")
    assert page.get_by_text(INJECTION).count() == 0 or page.locator('img[src="x"]').count() == 0
    shot(page, "5-compare")
    goto_page(page, "Speed", "Density sweep")
    shot(page, "6-speed")
    goto_page(page, "Runs", "Import")
    assert page.locator('img[src="x"]').count() == 0
    shot(page, "7-runs")

    assert dialogs == []  # no alert() ever ran
    page.close()

"""In a real browser: the needle tracker on a pass-key run, and the mask diff of two runs.

The store is seeded before the app starts with two real runs of the tiny model on one pass-key
prompt (two densities), through the worker's own job path. Screenshots land in
artifacts/screenshots/ (needle-tracker.png, mask-diff.png).
"""

from __future__ import annotations

import pytest
from test_browser import serve_app, settle, shot

from sketchwalk.app import prompts

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def passkey_store(tmp_path_factory):
    """A DuckDB file with two finished pass-key runs (density 0.2 and 0.5) and the key."""
    from tiny_models import make_tiny_model

    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.store import open_store
    from sketchwalk.worker.loop import Worker, make_request

    model = str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    db = tmp_path_factory.mktemp("needle") / "runs.duckdb"
    prompt, key = prompts.needle_prompt(120, depth=0.3)
    with open_store(str(db)) as store:
        jobs = [
            store.enqueue_job(
                make_request(prompt, SketchWalkConfig(block_size=16, density=d).to_dict(), model, 3)
            )
            for d in (0.2, 0.5)
        ]
        Worker(store).drain()
        runs = [store.get_job(j).run_id for j in jobs]
        assert all(store.get_job(j).status == "done" for j in jobs)
    return db, key, runs


@pytest.fixture(scope="module")
def server(passkey_store, tmp_path_factory):
    with serve_app(
        passkey_store[0], tmp_path_factory.mktemp("log"), SKETCHWALK_APP_WORKER="0"
    ) as url:
        yield url


def test_needle_tracker_and_mask_diff_in_a_real_browser(server, browser, passkey_store):
    from sketchwalk.store import open_store
    from sketchwalk.store.needle import trace

    db, key, (low, high) = passkey_store
    with open_store(str(db)) as store:
        expected = trace(store, low, key)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)

    # Explore the low-density run, type the pass key: strip, outlines and the sentence appear
    page.goto(server)
    page.get_by_role("heading", name="New run").wait_for(timeout=90_000)
    settle(page)
    nav = page.locator('[data-testid="stSidebarNav"]')
    nav.get_by_text("Explore", exact=True).click()
    page.get_by_role("heading", name="Explore").wait_for()
    settle(page)
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Run").first.click()
    page.get_by_role("option").filter(has_text=low[:8]).first.click()
    page.locator(".js-plotly-plot").nth(3).wait_for()
    settle(page)
    box = page.get_by_label("Needle: text in the prompt to follow (e.g. a pass key)", exact=True)
    assert box.input_value() == key  # a pass-key run: Explore follows its key at once
    box.fill(key)
    box.press("Enter")
    page.locator(".gtitle").filter(has_text="Needle through the layers").wait_for()
    settle(page)
    assert page.get_by_text(expected.sentence()).count() == 1
    kept = page.locator(".js-plotly-plot").filter(
        has=page.locator(".gtitle", has_text="Selected blocks")
    )
    assert kept.locator(".shapelayer path").count() >= 1  # the needle's blocks outlined
    shot(page, "needle-tracker")

    # Runs: select both runs, open the diff
    nav.get_by_text("Runs", exact=True).click()
    page.get_by_text("Selected runs", exact=True).wait_for()
    settle(page)
    picker = page.locator('[data-testid="stMultiSelect"]').filter(has_text="Selected runs")
    for rid in (low, high):
        picker.click()
        page.get_by_role("option").filter(has_text=rid[:8]).first.click()
        settle(page)
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Diff the masks of the two selected runs").click()
    page.locator(".gtitle").filter(has_text="Mask diff per layer").wait_for()
    settle(page)
    title = page.locator(".gtitle").filter(has_text="Kept by A only").first.text_content()
    assert " A only, " in title and " both" in title
    a_only = page.locator('[data-testid="stMetric"]').filter(has_text="A only").first.inner_text()
    assert a_only.split()[-1].isdigit()
    shot(page, "mask-diff")
    page.close()

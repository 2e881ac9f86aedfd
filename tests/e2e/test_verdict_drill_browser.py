"""In a real browser, on a stored run: the verdict panel, the drill-down from a high-KL token
(a click on its bar in Compare) to the layer that dropped its attention, with the row outlined
in Explore, and metric values that fit at 1400 px on Explore, Compare and Speed.

The store is seeded before the app starts with one real run of the tiny model (walking,
clean passes timed) through the worker's own job path. Screenshots land in
artifacts/screenshots/ (verdict-panel.png, drill-down.png).
"""

from __future__ import annotations

import pytest
from test_browser import serve_app, settle, shot

from sketchwalk.app import prompts

pytestmark = pytest.mark.browser

CUT_OFF = (  # metric values whose text is wider than their box (cut off with an ellipsis)
    "() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"] *')]"
    ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)"
)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A DuckDB file with one finished run of the tiny model; (db, run id, run, tokens)."""
    from tiny_models import make_tiny_model

    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.store import open_store
    from sketchwalk.worker.loop import Worker, make_request

    model = str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    db = tmp_path_factory.mktemp("verdict") / "runs.duckdb"
    cfg = SketchWalkConfig(block_size=16, density=0.2, beta=0.5).to_dict()
    with open_store(str(db)) as store:
        job = store.enqueue_job(make_request(prompts.license_text()[:1500], cfg, model, 4))
        Worker(store).drain()
        rid = store.get_job(job).run_id
        assert store.get_job(job).status == "done"
        run, toks = store.get_run(rid), store.tokens(rid)
    return db, rid, run, toks


@pytest.fixture(scope="module")
def server(stored, tmp_path_factory):
    with serve_app(stored[0], tmp_path_factory.mktemp("log"), SKETCHWALK_APP_WORKER="0") as url:
        yield url


def _nav(page, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
    page.get_by_role("heading", name=title).first.wait_for()
    settle(page)


def test_verdict_panel_on_explore(server, browser, stored):
    _, rid, run, _ = stored
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(90_000)
    page.goto(server)
    page.get_by_role("heading", name="New run").wait_for()
    settle(page)
    _nav(page, "Explore")
    panel = page.locator(".st-key-ex_verdict")
    panel.locator('[data-testid="stMetricValue"]').nth(5).wait_for()
    settle(page)
    text = panel.inner_text()
    m = run["metrics"]
    for label in ("Achieved density", "Mass kept", "KL to dense", "Top-1 agreement"):
        assert label in text, label
    assert f"{m['kl_mean']:.4f}" in text and f"{m['top1_agreement']:.1%}" in text
    assert f"target {m['density_target']:.2f}" in text
    assert "Prefill speed" in text and "Decode speed" in text
    assert "median of 3 clean passes" in text or "noise" in text
    assert page.evaluate(CUT_OFF) == []  # every number fits at 1400 px
    panel.screenshot(path=str(_shots() / "verdict-panel.png"))
    page.close()


def _shots():
    from test_browser import SHOTS

    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


def test_click_a_bad_token_then_open_the_layer_that_dropped_its_attention(server, browser, stored):
    _, rid, run, toks = stored
    n = run["prompt_tokens"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    page.goto(server)
    page.get_by_role("heading", name="New run").wait_for()
    settle(page)
    _nav(page, "Compare")
    page.get_by_text("From a bad token to its cause").wait_for()
    page.get_by_role("button", name="Explain this token").wait_for()  # computed on request
    settle(page)
    assert page.evaluate(CUT_OFF) == []

    # click a bar of the per-token KL strip: that token becomes the one explained
    sparse = toks[(toks["variant"] == "sparse") & (toks["position"] < n)].dropna(subset=["kl"])
    target = int(sparse.sort_values("kl", ascending=False)["position"].iloc[3])  # not the default
    strip = page.locator(".js-plotly-plot").filter(
        has=page.locator(".gtitle", has_text="Per-token KL")
    )
    strip.scroll_into_view_if_needed()
    bars = strip.locator(".bars .point path")
    bars.nth(target).click(force=True)  # bar k is position k (position 0 has no KL: empty bar)
    page.locator(".gtitle").filter(has_text=f"Token t{target}: its attention").wait_for()
    settle(page)
    # a later pick in the box is explained, not undone by the bar still selected in the chart
    worst = int(sparse.sort_values("kl", ascending=False)["position"].iloc[0])
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text="Token to explain")
    box.locator("input").click()
    page.keyboard.type(f"t{worst} ")  # the box filters its options as one types
    page.get_by_role("option").filter(has_text=f"t{worst} ").first.click()
    settle(page)
    page.get_by_role("button", name="Explain this token").click()
    page.locator(".gtitle").filter(has_text=f"Token t{worst}: its attention").wait_for()
    settle(page)
    target = worst
    first = page.get_by_role("button", name="Open layer").first
    label = first.inner_text()
    layer = int(label.split("Open layer ")[1].split(",")[0])
    shot(page, "drill-down")
    first.click()

    # Explore at that layer, the token's row outlined, its top sources per head
    page.get_by_role("heading", name="Explore").wait_for()
    page.locator(".gtitle").filter(has_text=f"top source tokens of t{target}").wait_for()
    settle(page)
    assert page.get_by_text(f"Layer {layer} ·").count() >= 1
    assert page.get_by_text(f"holds token t{target}").count() == 1
    kept = page.locator(".js-plotly-plot").filter(
        has=page.locator(".gtitle", has_text="Selected blocks")
    )
    assert kept.locator(".shapelayer path").count() >= 1  # the query row's outline
    page.get_by_role("button", name="Clear the token").click()
    page.get_by_text(f"holds token t{target}").wait_for(state="detached")

    _nav(page, "Speed")
    page.get_by_text("Density sweep").first.wait_for()
    assert page.evaluate(CUT_OFF) == []
    page.close()

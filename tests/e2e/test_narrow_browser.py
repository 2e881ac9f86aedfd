"""At 1024 x 900 px in a real browser: no label cut off with an ellipsis, no overlapping tick
labels on any chart, and Run on the landing page wholly above the fold (issue 49, items 10-11).

The store holds one real run of the tiny model (per-group selection) made through the worker's
own job path before the app starts.
"""

from __future__ import annotations

import json

import pytest
from test_browser import serve_app, settle

from sketchwalk.app import prompts

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1024, 900
CUT_LABELS = (  # label texts wider than their box (drawn cut off with an ellipsis)
    "() => [...document.querySelectorAll("
    '\'[data-testid="stMetricLabel"] *, [data-testid="stMetricValue"] *, '
    '[data-testid="stWidgetLabel"] *, button *\')]'
    ".filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)"
    ".map(e => e.innerText).filter(t => t.trim())"
)
OVERLAPPING_TICKS = """() => {
  const out = [];
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    for (const [axis, lo, hi] of [['xtick', 'left', 'right'], ['ytick', 'top', 'bottom']]) {
      const boxes = [...plot.querySelectorAll('.' + axis + ' text')]
        .map(t => t.getBoundingClientRect()).filter(r => r.width > 0)
        .sort((a, b) => a[lo] - b[lo]);
      for (let i = 1; i < boxes.length; i++) {
        const gap = boxes[i][lo] - boxes[i - 1][hi];
        const across = axis === 'xtick'
          ? boxes[i].top < boxes[i - 1].bottom && boxes[i - 1].top < boxes[i].bottom
          : boxes[i].left < boxes[i - 1].right && boxes[i - 1].left < boxes[i].right;
        if (gap < -1 && across) {
          const title = plot.querySelector('.gtitle');
          out.push((title ? title.textContent : '?') + ' ' + axis);
          break;
        }
      }
    }
  }
  return out;
}"""


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    from tiny_models import make_tiny_model

    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.store import open_store
    from sketchwalk.worker.loop import Worker, make_request

    model = str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    db = tmp_path_factory.mktemp("narrow") / "runs.duckdb"
    cfg = SketchWalkConfig(block_size=16, density=0.2).to_dict()
    with open_store(str(db)) as store:
        job = store.enqueue_job(make_request(prompts.license_text()[:3000], cfg, model, 8))
        Worker(store).drain()
        assert store.get_job(job).status == "done", store.get_job(job).error
    return db


@pytest.fixture(scope="module")
def server(stored, tmp_path_factory):
    with serve_app(stored, tmp_path_factory.mktemp("log"), SKETCHWALK_APP_WORKER="0") as url:
        yield url


def _nav(page, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
    page.get_by_role("heading", name=title).first.wait_for()
    settle(page)
    page.wait_for_timeout(1500)  # plotly lays out its ticks after the script run


def test_labels_fit_and_ticks_do_not_overlap_at_1024_px(server, browser):
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    page.set_default_timeout(90_000)
    page.goto(server)
    page.get_by_role("heading", name="New run").wait_for()
    settle(page)
    run = page.get_by_role("button", name="Run", exact=True).bounding_box()
    assert run is not None and run["y"] + run["height"] <= HEIGHT  # above the fold
    problems = {"New run": page.evaluate(CUT_LABELS)}
    for title in ("Explore", "Compare", "Speed"):
        _nav(page, title)
        problems[title] = page.evaluate(CUT_LABELS) + page.evaluate(OVERLAPPING_TICKS)
    _nav(page, "Explore")
    page.get_by_text("Decode tokens", exact=True).click()
    settle(page)
    page.wait_for_timeout(1500)
    problems["Explore, decode tokens"] = page.evaluate(OVERLAPPING_TICKS)
    bad = {k: v for k, v in problems.items() if v}
    assert not bad, json.dumps(bad)
    page.close()

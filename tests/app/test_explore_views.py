"""Explore's newer controls through AppTest: the needle tracker (and, below, the other views)."""

from __future__ import annotations

from run_helpers import new_app, spec

from sketchwalk.store import open_store
from sketchwalk.store.needle import trace


def _charts(at) -> dict[str, dict]:
    return {
        spec(c)["layout"].get("title", {}).get("text", ""): spec(c) for c in at.get("plotly_chart")
    }


def _explore(run_id):
    at = new_app().run()
    at.session_state["run_id"] = run_id
    at.switch_page("pages/explore.py").run()
    assert not at.exception, at.exception
    return at


NEEDLE = "Legal Entity"


def test_needle_outlines_blocks_draws_the_strip_and_says_where_it_was_dropped(app_env):
    url, ids = app_env
    rid = ids["sketchwalk"]
    expected = trace(open_store(url), rid, NEEDLE)
    at = _explore(rid)
    assert "Needle through the layers" not in " ".join(_charts(at))
    at.text_input(key="ex_needle").input(NEEDLE).run()
    assert not at.exception, at.exception
    assert at.info[0].value == expected.sentence()
    figs = _charts(at)
    strip = next(f for t, f in figs.items() if t.startswith("Needle through the layers"))
    layers = sorted({s.layer for s in expected.steps})
    assert strip["data"][0]["y"] == [f"layer {x}" for x in layers]
    assert strip["data"][0]["x"][0] == "prefill"
    b = expected.needle.blocks
    for title in ("Walk score W_l", "Selected blocks"):
        shapes = figs[title]["layout"].get("shapes", [])
        outlined = [s for s in shapes if s.get("name") == "needle"]
        assert outlined and outlined[0]["x0"] == b[0] - 0.5, title

    at.text_input(key="ex_needle").input("not in this prompt at all 123").run()
    assert any("does not occur" in w.value for w in at.warning)
    assert not any(t.startswith("Needle through") for t in _charts(at))

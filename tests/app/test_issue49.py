"""AppTests of issue 49's defects and asks: each fails without its fix."""

from __future__ import annotations

from run_helpers import new_app

from sketchwalk.store import open_store


def _page(at, page: str, run_id: str | None = None):
    if run_id is not None:
        at.session_state["run_id"] = run_id
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def test_compare_explains_a_token_of_the_run_switched_to(app_env):
    url, ids = app_env
    at = _page(new_app().run(), "compare", ids["sketchwalk"])
    at.selectbox(key="cmp_query").select_index(1).run()  # a token of the first run, picked
    stale = at.selectbox(key="cmp_query").options[1]
    at.selectbox(key="cmp_run").set_value(ids["injection"]).run()
    assert not at.exception, at.exception
    # the browser's box still shows, and sends, the first run's label: Streamlit hands an
    # unknown label to the page as the label string itself (SelectboxSerde.deserialize)
    box = at.selectbox(key="cmp_query")
    box.options.append(stale)
    box.set_value(stale)
    at.button(key="btn_cmp_explain").click().run()
    assert not at.exception, at.exception
    n = open_store(url).get_run(ids["injection"])["prompt_tokens"]
    box = at.selectbox(key="cmp_query")
    assert isinstance(box.value, int) and 0 < box.value < n
    assert box.options[0].startswith(f"t{box.value} ")  # the new run's worst token
    assert any(f"Token t{box.value}:" in i.value for i in at.info) or any(
        "nothing was dropped" in i.value for i in at.info
    )

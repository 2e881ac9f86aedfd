"""AppTests of issue 39's smaller items: each asserts the fixed behaviour."""

from __future__ import annotations

import uuid

import pytest
from known_runs import known_result
from run_helpers import new_app

from sketchwalk.app import prompts
from sketchwalk.engine.run.records import TokenRecord
from sketchwalk.store import open_store
from sketchwalk.worker.loop import Worker


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    url = str(tmp_path / "fresh.duckdb")
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return url


def test_unknown_model_id_is_refused_before_asking_the_hub(fresh, monkeypatch):
    import transformers

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_hub)
    at = new_app().run()
    name = f"no-such-org/no-such-model-{uuid.uuid4().hex[:8]}"
    at.text_input(key="nr_model").input(name).run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert any(
        f"cannot load model '{name}'" in e and "not in the Hugging Face cache" in e for e in errors
    )
    at.text_input(key="nr_model").input("not a valid id!").run()
    assert any("not a valid Hugging Face model id" in e.value for e in at.error)
    assert at.button(key="btn_run").disabled


def test_an_over_long_paste_is_refused_with_a_line_not_cut(fresh, tiny_model):
    at = new_app().run()
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input("a" * 204_800).run()
    assert not at.exception, at.exception
    assert len(at.text_area(key="nr_prompt").value) == 204_800  # kept whole: nothing cut
    assert any(
        "The prompt has 204,800 characters; the limit is 200,000" in e.value for e in at.error
    )
    assert at.button(key="btn_run").disabled


def test_a_short_prompt_says_it_cannot_reach_the_target_density(fresh, tiny_model):
    at = new_app().run()
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input(prompts.license_text()[:800]).run()
    warnings = [w.value for w in at.warning]
    assert any("forced blocks alone" in w and "target density 0.2" in w for w in warnings)
    assert not at.button(key="btn_run").disabled  # a notice, not a refusal
    at.text_area(key="nr_prompt").input(prompts.license_text()).run()  # 2k tokens: reachable
    assert not any("forced blocks alone" in w.value for w in at.warning)


def test_the_finished_run_shows_its_verdict_on_new_run(fresh, tiny_model, models):
    at = new_app().run()
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input(prompts.license_text()[:900]).run()
    at.selectbox(key="nr_block_size").select(16).run()
    at.number_input(key="nr_max_new").set_value(2).run()
    at.button(key="btn_run").click().run()
    store = open_store(fresh)
    Worker(store, models=models).drain()
    at.run()
    labels = [m.label for m in at.metric]
    for name in ("Achieved density", "Mass kept", "KL to dense", "Top-1 agreement"):
        assert any(label.startswith(name) for label in labels), (name, labels)
    assert any(label.startswith("Prefill speed") for label in labels)


@pytest.fixture
def stopped_early(fresh):
    """A known run whose sparse (and dense) generation stopped after 2 of 8 tokens."""
    res = known_result()
    n = res.prompt_tokens
    for variant in ("dense", "sparse"):
        res.tokens += [TokenRecord(variant, n + i, 7, f"g{i}", -1.0, 0.1) for i in range(2)]
    with open_store(fresh) as store:
        rid = store.create_run(
            {"prompt": res.prompt, "config": res.config, "max_new_tokens": 8}, status="running"
        )
        store.save_result(rid, res)
    return rid


def test_the_decode_strip_says_when_the_generation_hit_end_of_text(stopped_early):
    at = new_app().run()
    at.session_state["run_id"] = stopped_early
    at.switch_page("pages/explore.py").run()
    at.radio(key="ex_view").set_value("Decode tokens").run()
    assert not at.exception, at.exception
    assert any(
        "wrote its end-of-text token after 2 of the 8 new tokens" in c.value for c in at.caption
    )
    at.switch_page("pages/compare.py").run()
    assert any("sparse generation stopped after 2 tokens" in c.value for c in at.caption)


def test_the_needle_strip_explains_rank(stopped_early):
    at = new_app().run()
    at.session_state["run_id"] = stopped_early
    at.switch_page("pages/explore.py").run()
    at.text_input(key="ex_needle").input("KEY-4242").run()
    assert not at.exception, at.exception
    assert any("**#rank** = the best rank" in c.value for c in at.caption)

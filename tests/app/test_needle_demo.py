"""The needle demo tells the truth (issue 39): on the bundled pass-key sample the dense default
model answers the key, sparse at the default density and at 0.1 finds it and at 0.05 loses it,
and the verdict says so. Slow: it loads the real default model (SmolLM2-135M) and runs it three ways."""

from __future__ import annotations

import pytest

from sketchwalk.app import prompts
from sketchwalk.app.verdict import needle_item
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.models import load_model
from sketchwalk.engine.run.runner import RunOptions, run
from sketchwalk.eval.retrieval import make_item

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lm():
    return load_model(None)


def test_the_sample_is_the_evals_item(lm):
    item = make_item(lm.tokenizer, "passkey", 2048, 0.3, 0)
    assert prompts.needle_demo() == item.prompt
    assert item.answer == prompts.NEEDLE_DEMO_KEY == prompts.find_pass_key(item.prompt)


def test_found_at_the_default_density_and_lost_at_a_lower_one(lm):
    prompt = prompts.needle_demo()
    default = SketchWalkConfig()
    found = {}
    for density in (default.density, 0.1, 0.05):
        res = run(lm, prompt, default.with_(density=density), RunOptions(8, record=False))
        assert res.metrics["density_achieved"] < density + 0.03  # reachable at 2k tokens
        assert res.dense_text.strip().startswith(prompts.NEEDLE_DEMO_KEY)  # dense answers it
        view = {"prompt": prompt, "dense_text": res.dense_text, "sparse_text": res.sparse_text}
        found[density] = needle_item(view).value
    assert found == {default.density: "found", 0.1: "found", 0.05: "lost"}

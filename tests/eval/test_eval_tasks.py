"""The eval's prompts: offline texts chunked, retrieval prompts seeded and checkable, task specs."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from sketchwalk.errors import SketchWalkError
from sketchwalk.eval import retrieval as er
from sketchwalk.eval.items import build_items, parse_tasks
from sketchwalk.eval.texts import chunk_spans, load_source


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_generator_is_deterministic_per_seed_and_fits_the_length(tok):
    a = er.make_items(tok, er.DEFAULT_KINDS, (300, 600), (0.1, 0.9), per_depth=2, seed=7)
    b = er.make_items(tok, er.DEFAULT_KINDS, (300, 600), (0.1, 0.9), per_depth=2, seed=7)
    c = er.make_items(tok, er.DEFAULT_KINDS, (300, 600), (0.1, 0.9), per_depth=2, seed=8)
    assert a == b and len(a) == 16
    assert [x.answer for x in a] != [x.answer for x in c]
    assert len({x.answer for x in a}) > 8  # items differ from each other too
    for item in a:
        n = len(tok(item.prompt, add_special_tokens=False).input_ids)
        assert n == item.n_tokens and item.length - 40 <= n <= item.length


def test_answers_are_checkable_and_sit_at_the_depth(tok):
    for depth in (0.1, 0.5, 0.9):
        p = er.make_item(tok, "passkey", 800, depth, 0, seed=1)
        assert p.prompt.count(p.answer) == 2 and len(p.answer) == 5
        where = p.prompt.index(f"The pass key is {p.answer}") / len(p.prompt)
        assert abs(where - depth) < 0.1
        kv = er.make_item(tok, "kv", 800, depth, 0, seed=1)
        asked = kv.prompt.rsplit("What is the secret number of the ", 1)[1].split("?")[0]
        line = f"The secret number of the {asked} is {kv.answer}."
        assert kv.prompt.count(line) == 1
        lines = [x for x in kv.prompt.splitlines() if x.startswith("The secret number")]
        assert abs(lines.index(line) / (len(lines) - 1) - depth) < 0.05
    assert er.is_correct(" 65125.", "65125") and er.is_correct("is 65125 and", "65125")
    assert not er.is_correct(" the pass key", "65125") and not er.is_correct("651250", "65125")
    with pytest.raises(SketchWalkError, match="too short"):
        er.make_item(tok, "passkey", 20, 0.5, 0)


def test_offline_texts_and_chunks():
    ((name, text),) = load_source("gpl-3")
    assert name == "gpl-3" and "GNU GENERAL PUBLIC LICENSE" in text
    assert len(load_source("python-stdlib")) == 5
    ((name, prose),) = load_source("long-prose")  # one document past 8k tokens, no GPL-3
    assert name == "long-prose" and len(prose) > 130_000 and "Version 3, 29 June 2007" not in prose
    ((_, code),) = load_source("long-code")
    assert len(code) > 200_000 and code.count("\ndef ") + code.count("\n    def ") > 100
    assert chunk_spans(1000, 450) == [(0, 450), (450, 900)]  # 100-token tail < half: dropped
    assert chunk_spans(1000, 300) == [(0, 300), (300, 600), (600, 900)]
    assert chunk_spans(1100, 400)[-1] == (800, 1100)
    with pytest.raises(SketchWalkError, match="unknown text source"):
        load_source("nope")


def test_task_specs_and_items(tok, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("hello world. " * 300)
    tasks = parse_tasks(f"lm, retrieval:kv,file:{f}")
    assert tasks == [("lm", None), ("retrieval", "kv"), ("file", str(f))]
    items = build_items(tok, tasks, (256,), (0.5,), max_chunks=2)
    kinds = [(i.task, i.source) for i in items]
    assert kinds == [("lm", "gpl-3")] * 2 + [("retrieval", "kv")] + [("file", "p.txt")] * 2
    assert all(i.ids.shape == (1, 256) for i in items if i.task != "retrieval")
    assert items[2].answer is not None and items[0].answer is None
    for bad, words in [
        ("", "no tasks"),
        ("speed", "unknown task"),
        ("lm:klingon", "unknown text source"),
        ("retrieval:haystack", "unknown retrieval kind"),
        ("file:", "needs a path"),
        (f"file:{tmp_path}/missing.txt", "does not exist"),
    ]:
        with pytest.raises(SketchWalkError, match=words):
            parse_tasks(bad)

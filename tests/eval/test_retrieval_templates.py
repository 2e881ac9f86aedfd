"""Pass-key templates: other fillers, key formats and wordings, a held-out set kept apart."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from sketchwalk.eval import retrieval as er
from sketchwalk.eval import templates as et
from sketchwalk.eval.items import build_items, parse_tasks


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("kind", sorted(et.SETS))
def test_templated_items_fit_hold_their_key_at_the_depth_and_repeat(tok, kind):
    items = er.make_items(tok, (kind,), (700,), (0.1, 0.5, 0.9), per_depth=3, seed=3)
    assert items == er.make_items(tok, (kind,), (700,), (0.1, 0.5, 0.9), per_depth=3, seed=3)
    assert [x.template for x in items[:3]] == [t.name for t in et.SETS[kind]]
    for item in items:
        t = next(t for t in et.SETS[kind] if t.name == item.template)
        assert 600 <= item.n_tokens <= 700
        assert len(item.answer) == t.digits and item.answer.isdigit()
        needle = t.needle.format(key=item.answer)
        assert item.prompt.count(needle) == 1 and item.prompt.endswith(t.question)
        # the needle after round(units * depth) filler units: its place in the body
        body = item.prompt[len(t.head) : -len(t.question)]
        where = body.index(needle) / len(body)
        assert abs(where - item.depth) < 0.15, (item.template, where, item.depth)
        assert er.is_correct(f" {item.answer}.", item.answer)


def test_held_out_templates_share_nothing_with_the_tuning_ones():
    tuned, held = et.TUNING, et.HELD_OUT
    for field in ("name", "needle", "question", "head"):
        shared = {getattr(t, field) for t in tuned} & {getattr(t, field) for t in held}
        assert shared <= {""}, field  # no head at all is not a shared wording
    fillers = {(t.filler, t.lines) for t in tuned}
    assert all((t.filler, t.lines) not in fillers for t in held)
    styles = {t.filler for t in (*tuned, *held)}
    assert styles == {"repeat", "shuffle", "text"}  # every filler style is exercised
    assert len({t.digits for t in (*tuned, *held)}) >= 3  # key formats differ


def test_fillers_follow_their_style():
    rng = random.Random(0)
    rep = et.Template("r", "repeat", ("A.", "B."), "{key}", "?")
    assert et.filler_units(rep, rng, 5) == ["A.", "B.", "A.", "B.", "A."]
    shuffled = et.filler_units(et.TUNING[0], random.Random(1), 200)
    assert set(shuffled) <= set(et.PROSE) and len(set(shuffled)) > 10
    lines = et.real_lines("license:GPL-2")
    text = et.filler_units(et.TUNING[1], random.Random(2), 3 * len(lines))
    start = lines.index(text[0])
    assert text[: len(lines)] == [*lines[start:], *lines[:start]]  # read on, wrapping round
    with pytest.raises(Exception, match="pass-key filler"):
        et.real_lines("license:NO-SUCH-LICENSE")


def test_task_specs_name_the_sets_and_a_bare_retrieval_keeps_the_classic_kinds(tok):
    assert parse_tasks("retrieval:passkey-heldout") == [("retrieval", "passkey-heldout")]
    bare = build_items(tok, parse_tasks("retrieval"), (400,), (0.5,))
    assert [i.source for i in bare] == ["passkey", "kv"]
    held = build_items(tok, parse_tasks("retrieval:passkey-heldout"), (400,), (0.5,), per_depth=3)
    assert [i.label for i in held] == [
        f"passkey-heldout d=0.5 #{i} {t.name}" for i, t in enumerate(et.HELD_OUT)
    ]
    assert all(i.answer and i.answer in tok.decode(i.ids[0]) for i in held)

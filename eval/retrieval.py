"""Synthetic long-context retrieval prompts with checkable answers, built offline and seeded.

Four kinds, all completion-style (the prompt ends where the answer begins, so base and instruct
models alike answer with the number first):

- passkey (Mohtashami & Jaggi 2023, "Landmark Attention"): a 5-digit pass key hidden at a given
  depth inside repeated filler sentences. Filler is uninformative, so only attention that reaches
  the needle's block can answer; a local window alone cannot.
- kv: many lines "The secret number of the <adjective> <animal> is <5 digits>." and a question
  about one of them at a given depth. Every line is a distractor that looks like the answer, so
  it also tests that the RIGHT far block is kept, not just some far block.
- passkey-varied / passkey-heldout: pass keys in other fillers, key formats and wordings
  (eval/templates.py); item i uses template i % 3. The first set may be tuned on, the second
  is for reporting only, so a selection tuned on the project's prompt is checked on prompts it
  never saw.

The generator is deterministic: item i of (kind, length, depth) draws everything from
random.Random(f"{seed}/{kind}/{length}/{depth}/{i}") (string seeds hash stably across runs and
platforms). The answer is the number; a generation is correct when its first integer equals it.
Lengths are prompt tokens under the model's tokenizer: the filler (or list) is grown to the
largest size that stays within the length.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from sketchwalk.errors import SketchWalkError
from sketchwalk.eval import templates

KINDS = ("passkey", "kv", *templates.SETS)
DEFAULT_KINDS = ("passkey", "kv")  # a bare `retrieval` task: the project's own two
DEFAULT_DEPTHS = (0.1, 0.5, 0.9)

_HEAD = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the important information there.\n\n"
)
_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
_KV_HEAD = "Below is a list of secret numbers. Remember them; I will ask about one of them.\n"
_ADJECTIVES = [
    "red",
    "blue",
    "green",
    "small",
    "big",
    "old",
    "young",
    "happy",
    "dark",
    "bright",
    "quiet",
    "loud",
    "brave",
    "calm",
    "clever",
    "gentle",
    "grumpy",
    "lazy",
    "proud",
    "shy",
    "swift",
    "tiny",
    "wild",
    "wise",
    "silver",
    "golden",
    "sleepy",
    "hungry",
    "fuzzy",
    "polite",
]
_ANIMALS = [
    "fox",
    "cat",
    "owl",
    "wolf",
    "bear",
    "frog",
    "lion",
    "duck",
    "goat",
    "crow",
    "hare",
    "mole",
    "seal",
    "swan",
    "toad",
    "yak",
    "crab",
    "deer",
    "eel",
    "hawk",
    "lynx",
    "mink",
    "newt",
    "orca",
    "pony",
    "rat",
    "slug",
    "tern",
    "vole",
    "wasp",
]
_INT = re.compile(r"\d+")


@dataclass(frozen=True)
class RetrievalItem:
    kind: str
    length: int  # the nominal (requested) prompt length in tokens
    depth: float  # where the needle sits, as a fraction of the haystack
    index: int
    prompt: str
    answer: str
    n_tokens: int  # actual prompt tokens (<= length)
    template: str = ""  # the template's name for the templated kinds


def is_correct(generated: str, answer: str) -> bool:
    """Exact match: the first integer of the generation is the answer."""
    found = _INT.search(generated)
    return found is not None and found.group(0) == answer


def _passkey(rng: random.Random, units: int, depth: float) -> tuple[str, str]:
    key = str(rng.randint(10000, 99999))
    before = int(round(units * depth))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    body = _FILLER * before + needle + _FILLER * (units - before)
    return _HEAD + body + "\n\nWhat is the pass key? The pass key is", key


def _kv(rng: random.Random, units: int, depth: float) -> tuple[str, str]:
    names = [f"{a} {b}" for a in _ADJECTIVES for b in _ANIMALS]
    units = max(1, min(units, len(names)))
    chosen = rng.sample(names, units)
    values = [str(rng.randint(10000, 99999)) for _ in chosen]
    target = min(units - 1, int(round(depth * (units - 1))))
    lines = "\n".join(
        f"The secret number of the {n} is {v}." for n, v in zip(chosen, values, strict=True)
    )
    name = chosen[target]
    question = f"\n\nWhat is the secret number of the {name}? The secret number of the {name} is"
    return _KV_HEAD + lines + question, values[target]


_BUILDERS = {"passkey": _passkey, "kv": _kv}


def make_item(
    tokenizer, kind: str, length: int, depth: float, index: int, seed: int = 0
) -> RetrievalItem:
    """One prompt of `kind` with at most `length` tokens, the needle at `depth` (0..1)."""
    if kind not in KINDS:
        raise SketchWalkError(f"unknown retrieval kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not 0.0 <= depth <= 1.0:
        raise SketchWalkError(f"retrieval depth must be in [0, 1], got {depth}")
    template = templates.template_for(kind, index) if kind in templates.SETS else None
    build = template.build if template is not None else _BUILDERS[kind]
    tag = f"{seed}/{kind}/{length}/{depth}/{index}"

    def count(units: int) -> tuple[int, str, str]:
        prompt, answer = build(random.Random(tag), units, depth)
        return len(tokenizer(prompt, add_special_tokens=False).input_ids), prompt, answer

    lo, hi = 1, 2
    while count(hi)[0] <= length and hi < 1 << 16:
        lo, hi = hi, hi * 2
    if count(lo)[0] > length:
        raise SketchWalkError(f"retrieval length {length} is too short for a {kind} prompt")
    while hi - lo > 1:  # largest haystack that fits
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid)[0] <= length else (lo, mid)
    n, prompt, answer = count(lo)
    name = template.name if template is not None else ""
    return RetrievalItem(kind, length, depth, index, prompt, answer, n, name)


def make_items(
    tokenizer,
    kinds: tuple[str, ...] = KINDS,
    lengths: tuple[int, ...] = (2048,),
    depths: tuple[float, ...] = DEFAULT_DEPTHS,
    per_depth: int = 1,
    seed: int = 0,
) -> list[RetrievalItem]:
    """Every (kind, length, depth, index) item, in that order."""
    return [
        make_item(tokenizer, kind, length, depth, i, seed)
        for kind in kinds
        for length in lengths
        for depth in depths
        for i in range(per_depth)
    ]

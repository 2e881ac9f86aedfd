"""Bundled sample prompts: a license text, a code file, and synthetic pass-key retrieval prompts.

The license and code are files under app/samples/ (package data). The retrieval prompt is
generated: filler sentences with a random pass key hidden at a chosen depth, and the question at
the end, the classic test of whether sparse attention still finds one far-away block.
"""

from __future__ import annotations

import random
from importlib import resources

from sketchwalk.store.needle import pass_key

SAMPLES_DIR = "samples"
FILLER = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
    "The river flows past the old mill and on towards the sea.",
    "Clouds drift slowly over the hills in the afternoon.",
    "A farmer walks along the road with his dog.",
)


def _read(name: str) -> str:
    return resources.files("sketchwalk.app").joinpath(SAMPLES_DIR, name).read_text(encoding="utf-8")


def license_text() -> str:
    """The Apache License 2.0 terms (about 2k tokens): long, real English prose."""
    return _read("apache-2.0.txt")


def code_text() -> str:
    """A Python module written for this project (about 1.3k tokens)."""
    return _read("sample_code.py")


NEEDLE_DEMO = "passkey-2k-12887.txt"
NEEDLE_DEMO_KEY = "12887"


def needle_demo() -> str:
    """A pass-key prompt picked by running it (tests/app/test_needle_demo.py keeps it true):
    the dense default model answers 12887, sparse at the default density 0.2 and at 0.1 finds
    it, at 0.05 it is lost. It is eval/retrieval.py's item (passkey, 2048 tokens, depth 0.3,
    index 0)."""
    return _read(NEEDLE_DEMO)


def needle_prompt(n_sentences: int = 300, depth: float = 0.5, seed: int = 0) -> tuple[str, str]:
    """(prompt, pass key): a 5-digit key hidden at `depth` (0 = start, 1 = end) of filler text."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    rng = random.Random(seed)
    key = f"{rng.randint(10000, 99999)}"
    sentences = [rng.choice(FILLER) for _ in range(max(1, n_sentences))]
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    sentences.insert(round(depth * len(sentences)), needle)
    intro = (
        "There is an important piece of information hidden inside a lot of irrelevant text. "
        "Find it and memorize it. I will quiz you about it.\n\n"
    )
    return intro + " ".join(sentences) + "\n\nWhat is the pass key? The pass key is", key


def find_pass_key(prompt: str) -> str | None:
    """The key of a pass-key prompt (what Explore follows by default)."""
    return pass_key(prompt)


NEEDLE_DEMO_LABEL = (
    "Needle found at 0.1, lost at 0.05: pass key 12887 (≈2k tokens; Explore follows it)"
)
SAMPLES = {
    "Apache-2.0 license (≈2k tokens)": license_text,
    "Python code file (≈1.3k tokens)": code_text,
    "Pass-key retrieval (≈1k tokens)": lambda: needle_prompt(150)[0],
    "Pass-key retrieval (≈2k tokens)": lambda: needle_prompt(300)[0],
    "Pass-key retrieval (≈4k tokens)": lambda: needle_prompt(600)[0],
    NEEDLE_DEMO_LABEL: needle_demo,
}
"""Label shown in the New run page -> function returning the prompt text."""

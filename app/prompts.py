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


SAMPLES = {
    "Apache-2.0 license (≈2k tokens)": license_text,
    "Python code file (≈1.3k tokens)": code_text,
    "Pass-key retrieval (≈1k tokens)": lambda: needle_prompt(150)[0],
    "Pass-key retrieval (≈2k tokens)": lambda: needle_prompt(300)[0],
    "Pass-key retrieval (≈4k tokens)": lambda: needle_prompt(600)[0],
    "Needle found or lost: pass key near the start (≈2k tokens; Explore follows it)": lambda: (
        needle_prompt(300, depth=0.1, seed=7)[0]
    ),
}
"""Label shown in the New run page -> function returning the prompt text."""

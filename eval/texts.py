"""Long text that every machine has offline, for the language-modelling task.

Debian ships the licence texts in /usr/share/common-licenses (real English prose; GPL-3 is about
8k tokens with SmolLM2's tokenizer) and Python ships its standard library's source (real code).
Nothing is downloaded, so the numbers can be reproduced anywhere these files exist.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from sketchwalk.errors import SketchWalkError

LICENSES = Path("/usr/share/common-licenses")
LICENSE_SOURCES = {
    "gpl-3": "GPL-3",
    "gpl-2": "GPL-2",
    "lgpl-2.1": "LGPL-2.1",
    "apache-2.0": "Apache-2.0",
    "mpl-2.0": "MPL-2.0",
}
STDLIB_FILES = ("argparse.py", "inspect.py", "typing.py", "subprocess.py", "dataclasses.py")
"""Long, stable stdlib modules (each a separate document) for the `python-stdlib` source."""
# One document past the default model's 8192 positions, for RoPE-scaled runs (16k-32k): prefixes
# of the same text at every length, so KL against length compares like with like. The licences
# other than GPL-3 (the tuning text) joined (~32.5k tokens with SmolLM2's tokenizer), and one long
# stdlib module (~61k tokens).
LONG_PROSE = ("GPL-2", "LGPL-2.1", "MPL-1.1", "GFDL-1.3", "MPL-2.0", "Apache-2.0", "GPL-1")
LONG_PROSE += ("Artistic", "CC0-1.0")
LONG_CODE = "_pydecimal.py"
SOURCES = (*LICENSE_SOURCES, "python-stdlib", "long-prose", "long-code")
DEFAULT_SOURCE = "gpl-3"


def load_source(name: str) -> list[tuple[str, str]]:
    """(document name, text) pairs of an offline source; one-line error when it is missing."""
    if name in LICENSE_SOURCES:
        path = LICENSES / LICENSE_SOURCES[name]
        return [(name, read_text(path))]
    root = Path(sysconfig.get_paths()["stdlib"])
    if name == "python-stdlib":
        return [(f"stdlib/{f}", read_text(root / f)) for f in STDLIB_FILES]
    if name == "long-prose":
        return [(name, "\n\n".join(read_text(LICENSES / f) for f in LONG_PROSE))]
    if name == "long-code":
        return [(name, read_text(root / LONG_CODE))]
    raise SketchWalkError(f"unknown text source {name!r}; choose one of {', '.join(SOURCES)}")


def read_text(path: Path) -> str:
    """A UTF-8 text file; one-line error when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SketchWalkError(f"cannot read {path}: {exc.strerror or exc}") from None


def chunk_spans(n_tokens: int, length: int, min_fraction: float = 0.5) -> list[tuple[int, int]]:
    """Non-overlapping [start, end) windows of `length` tokens covering a document.

    The last, shorter window is kept only when it holds at least min_fraction * length tokens:
    a 6k-token measurement should not be diluted by a 300-token tail whose attention is short
    (and therefore barely sparse). Documents shorter than that give no window at all.
    """
    if length < 1:
        raise SketchWalkError(f"chunk length must be positive, got {length}")
    spans = []
    for start in range(0, n_tokens, length):
        end = min(n_tokens, start + length)
        if end - start >= min_fraction * length:
            spans.append((start, end))
    return spans

"""Pass-key templates beyond the project's own prompt: other fillers, key formats and questions.

Why: the defaults were tuned while the project's one pass-key prompt (`passkey`: a 5-digit key
in the same five repeated sentences) was the retrieval check, and a user's own wording and
filler lost keys the dense model found. These templates vary what a selection could have
overfitted to: the filler (repeated sentences, shuffled prose, a real licence text, Python
source, a diary), the key (4 to 7 digits, as a code, a PIN, a token) and the wording of the
needle and of the question. Two sets:

- `TUNING` (retrieval kind `passkey-varied`): may be looked at while choosing knobs;
- `HELD_OUT` (kind `passkey-heldout`): for reporting only; never tune on it.

Every template is completion-style (the prompt ends where the key begins) and its answer is
an integer, so `retrieval.is_correct` scores it. Real-text fillers read files every Debian and
Python install has (/usr/share/common-licenses, the standard library); nothing is downloaded.
"""

from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sketchwalk.errors import SketchWalkError

LICENSES = Path("/usr/share/common-licenses")

# Plain sentences without digits, shuffled per prompt: prose that does not repeat every line.
PROSE = (
    "The river flows past the old mill and on towards the sea.",
    "Clouds drift slowly over the hills in the afternoon.",
    "A farmer walks along the road with his dog.",
    "The baker opens his shop before the sun comes up.",
    "Children play in the park until their parents call them home.",
    "The library is quiet except for the turning of pages.",
    "Rain taps against the window of the small kitchen.",
    "An old ship rests in the harbour, its sails folded.",
    "The mountain path winds between tall pine trees.",
    "A cat sleeps on the warm stones of the garden wall.",
    "The market is busy with people buying fruit and bread.",
    "Snow covers the fields and the roofs of the village.",
    "The teacher writes a long sentence on the blackboard.",
    "Bees move from flower to flower in the meadow.",
    "The train leaves the station and crosses the bridge.",
    "A lamp burns in the window of the lighthouse.",
    "The wind carries the smell of the sea inland.",
    "Two friends talk about their plans for the summer.",
    "The museum shows paintings from many centuries.",
    "A fisherman mends his net on the quiet beach.",
    "The forest is dark and full of the sound of birds.",
    "Leaves fall from the trees and gather on the path.",
    "The orchestra tunes its instruments before the concert.",
    "A small boat drifts across the calm lake.",
    "The gardener plants roses along the fence.",
    "Lanterns light the narrow streets of the old town.",
    "The shepherd counts his sheep as they pass the gate.",
    "A storm gathers over the distant mountains.",
    "The potter shapes a bowl from wet grey clay.",
    "Travellers rest at the inn after a long journey.",
)

# A diary's lines for the held-out set: first person, no digits.
DIARY = (
    "Woke up early and made coffee before anyone else was awake.",
    "Spent the morning answering letters and tidying the desk.",
    "Walked to the post office; the queue was longer than usual.",
    "Lunch with my sister, who told me about her new garden.",
    "The neighbours were painting their fence again.",
    "Read a few chapters of the novel I started last week.",
    "It rained all afternoon, so I stayed inside and cooked soup.",
    "Called the plumber about the dripping tap in the bathroom.",
    "Went for a long walk by the canal in the evening.",
    "Fixed the wobbly chair in the dining room at last.",
    "The cat knocked a plant off the windowsill.",
    "Watched an old film and fell asleep before the end.",
    "Bought bread, cheese and apples at the corner shop.",
    "Wrote a list of things to do before the holidays.",
    "My friend from school visited and we talked for hours.",
    "Cleaned the windows; the whole room looks brighter.",
    "Tried a new recipe for dinner; it needed more salt.",
    "The bus was late, so I walked most of the way.",
    "Sorted the old photographs into albums.",
    "Went to bed early with a cup of tea.",
)


@dataclass(frozen=True)
class Template:
    """One pass-key prompt shape: head, filler (a style and its lines), needle, question, key."""

    name: str
    filler: str  # "repeat" | "shuffle" | "text"
    lines: tuple[str, ...] | str  # sentences, or "license:NAME" / "stdlib:FILE" for real text
    needle: str  # with {key}
    question: str  # ends where the key begins
    digits: int = 5
    head: str = ""
    joiner: str = " "  # between filler units ("\n" for line-based text)

    def build(self, rng: random.Random, units: int, depth: float) -> tuple[str, str]:
        """(prompt, key) with `units` filler units and the needle after round(units * depth)."""
        key = str(rng.randint(10 ** (self.digits - 1), 10**self.digits - 1))
        body = filler_units(self, rng, units)
        before = int(round(units * depth))
        parts = [*body[:before], self.needle.format(key=key), *body[before:]]
        return self.head + self.joiner.join(parts) + self.question, key


def filler_units(t: Template, rng: random.Random, units: int) -> list[str]:
    """`units` filler units of template t: its sentences repeated in order, shuffled, or a
    real text's lines read on from a seeded start (wrapping round at the end)."""
    if t.filler == "repeat":
        lines = t.lines
        return [lines[i % len(lines)] for i in range(units)]
    if t.filler == "shuffle":
        return [rng.choice(t.lines) for _ in range(units)]
    lines = real_lines(str(t.lines))
    start = rng.randrange(len(lines))
    return [lines[(start + i) % len(lines)] for i in range(units)]


@cache
def real_lines(spec: str) -> tuple[str, ...]:
    """The non-blank lines of a real text: "license:GPL-2" or "stdlib:shutil.py"."""
    kind, _, name = spec.partition(":")
    root = LICENSES if kind == "license" else Path(sysconfig.get_paths()["stdlib"])
    path = root / name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SketchWalkError(f"pass-key filler {path}: {exc.strerror or exc}") from None
    if kind == "license":  # sentences: the license's lines are wrapped mid-sentence
        flat = " ".join(text.split())
        lines = tuple(s.strip() + "." for s in flat.split(". ") if s.strip())
    else:
        lines = tuple(x.rstrip() for x in text.splitlines() if x.strip())
    if not lines:
        raise SketchWalkError(f"pass-key filler {path} is empty")
    return lines


_HEAD = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the important information there.\n\n"
)

TUNING: tuple[Template, ...] = (
    Template(
        "prose",
        "shuffle",
        PROSE,
        "The pass key is {key}. Remember it. {key} is the pass key.",
        "\n\nWhat is the pass key? The pass key is",
        head=_HEAD,
    ),
    Template(
        "license",
        "text",
        "license:GPL-2",
        "The secret code is {key}.",
        "\n\nWhat is the secret code mentioned in the document? The secret code is",
        digits=6,
        head="Read the document below carefully. A secret code is hidden in it.\n\n",
    ),
    Template(
        "repeat",
        "repeat",
        ("The river flows to the sea.", "Birds sing in the morning.", "The road is long."),
        "Remember this number: {key}.",
        "\n\nWhich number did I ask you to remember? The number was",
        digits=4,
    ),
)

HELD_OUT: tuple[Template, ...] = (
    Template(
        "diary",
        "shuffle",
        DIARY,
        "Note to self: my bank PIN is {key}, do not forget it.",
        "\n\nQuestion: What is my bank PIN?\nAnswer: My bank PIN is",
        head="These are pages from my diary.\n\n",
    ),
    Template(
        "code",
        "text",
        "stdlib:shutil.py",
        "# The access token is {key}. Keep it safe.",
        "\n\n# Q: What is the access token written in a comment above?\n# A: The access token is",
        digits=7,
        joiner="\n",
    ),
    Template(
        "prose-password",
        "text",
        "license:GFDL-1.3",
        "(By the way, the password for the archive is {key}.)",
        "\n\nI hid a password for the archive in the text above. "
        "What is it? The password for the archive is",
        head="Please read this license. One sentence in it does not belong there.\n\n",
    ),
)

SETS = {"passkey-varied": TUNING, "passkey-heldout": HELD_OUT}
"""Retrieval kind -> its templates; item i of a kind uses template i % len (per_depth 3 = each
template at each depth)."""


def template_for(kind: str, index: int) -> Template:
    templates = SETS[kind]
    return templates[index % len(templates)]

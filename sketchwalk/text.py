"""Text bound for a terminal: prompts and ids come from users and files, and an escape sequence
among them could retitle, clear or spoof the user's terminal when printed as is."""

from __future__ import annotations

import re


def terminal_safe(text: str) -> str:
    """Control and other non-printable characters shown as visible escapes (\\x1b, \\n)."""
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def terminal_text(text: str) -> str:
    """Multi-line text (a model's generation) for a terminal: line breaks and tabs kept, every
    other control character (ESC of an OSC or CSI sequence, BEL, NUL, ...) shown escaped."""
    return "".join(ch if ch in "\n\t" else terminal_safe(ch) for ch in text)


_MARKDOWN = set("\\`*_[]<>#|~$")
"""What turns text into links, images, code, emphasis, HTML, headings, tables or math; list
markers matter only at the start of a line and are escaped there."""


def plain_markdown(text: str) -> str:
    """Text shown through a markdown renderer (st.error, st.info) exactly as typed: a model id
    like `[x](javascript:...)` or `**bold**` from a user stays literal, never a link or style."""
    out = "".join("\\" + ch if ch in _MARKDOWN else ch for ch in text)
    out = out.replace("://", "\\://")  # no bare-URL autolinks
    out = re.sub(r"^(\d+)([.)])", r"\1\\\2", out)  # "1. " would start a numbered list
    return "\\" + out if out[:1] in ("-", "+", "=") else out

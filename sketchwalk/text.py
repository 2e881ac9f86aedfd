"""Text bound for a terminal: prompts and ids come from users and files, and an escape sequence
among them could retitle, clear or spoof the user's terminal when printed as is."""

from __future__ import annotations


def terminal_safe(text: str) -> str:
    """Control and other non-printable characters shown as visible escapes (\\x1b, \\n)."""
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


_MARKDOWN = set("\\`*_{}[]()<>#+-.!|~$:")


def plain_markdown(text: str) -> str:
    """Text shown through a markdown renderer (st.error, st.info) exactly as typed: a model id
    like `[x](javascript:...)` or `**bold**` from a user stays literal, never a link or style."""
    return "".join("\\" + ch if ch in _MARKDOWN else ch for ch in text)

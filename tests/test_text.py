"""User text bound for terminals and markdown boxes stays literal."""

from __future__ import annotations

import pytest

from sketchwalk.text import plain_markdown, terminal_safe


def test_terminal_escapes_are_shown_not_sent():
    assert terminal_safe("ok \x1b]0;owned\x07 tab\there") == r"ok \x1b]0;owned\x07 tab\there"
    assert terminal_safe("plain text, é ü") == "plain text, é ü"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("[x](javascript:alert(1))", r"\[x\](javascript:alert(1))"),
        ("**bold** `code` <b>", r"\*\*bold\*\* \`code\` \<b\>"),
        ("see http://evil.example", r"see http\://evil.example"),
        ("# heading", r"\# heading"),
        ("- item", r"\- item"),
        ("3. third", r"3\. third"),
        ("comma-separated (plain) words.", "comma-separated (plain) words."),
    ],
)
def test_markdown_is_escaped(text, shown):
    assert plain_markdown(text) == shown

"""The README's Python example runs as written, on the default model, and prints what its
comment says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def first_python_block(text: str) -> str:
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "the README has no Python example"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_example_runs_and_prints_its_comment():
    code = first_python_block(README.read_text())
    said = re.search(r"print\(.*\)\s+#\s*(.+)", code)
    assert said, "the example's print line says what it prints in a comment"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().strip().splitlines()[-1] == said.group(1).strip()


def test_the_example_comes_before_any_other_section():
    text = README.read_text()
    assert text.index("```python") < text.index("\n## ")

"""The repository explains itself: every relative link in the README and docs/ reaches a file
that exists, and every #anchor a heading of that file (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slugs(page: Path) -> set[str]:
    """Anchors GitHub gives the page's headings (lowercase, punctuation dropped, spaces to
    hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or anchor and dest.suffix == ".md" and anchor not in slugs(dest):
            broken.append(target)
    assert not broken, broken


def test_the_readme_starts_with_the_two_commands():
    first = ROOT.joinpath("README.md").read_text().splitlines()[:4]
    assert (
        first[0] == "```bash"
        and first[1].startswith("make app")
        and first[2].startswith("make test")
    )

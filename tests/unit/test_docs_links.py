"""Every relative link of the README and of ``docs/`` resolves: the file (or folder) it names
exists, and an ``#anchor`` into a Markdown page names one of that page's headings, slugged as
GitHub slugs them (lower case; punctuation but ``-`` and ``_`` dropped; spaces to ``-``; a repeated
heading gets ``-1``, ``-2`` …). Links inside code (fenced blocks, inline code) are not links and are
skipped, as are absolute URLs (``https:``, ``mailto:``).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code."""
    return _CODE.sub("", _FENCE.sub("", text))


def slugs(text: str) -> set[str]:
    """The anchors GitHub makes for the headings of Markdown ``text``."""
    seen: Counter[str] = Counter()
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return out


def links(page: Path) -> list[str]:
    """The relative link targets of ``page``, in order."""
    return [t for t in _LINK.findall(_prose(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_pages_are_found():
    assert len(PAGES) > 10 and all(p.is_file() for p in PAGES), PAGES


def test_slugs_follow_github():
    assert slugs("# A `b` c: d/e\n## Who's (it) for?\n## Who's (it) for?\n```\n# not a heading\n```\n") == {
        "a-b-c-de", "whos-it-for", "whos-it-for-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)

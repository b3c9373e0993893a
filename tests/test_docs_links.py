"""The README and docs/ point only at files (and headings) that exist; the README stays short and
its layout names every package.

Docs move and get renamed; a link that still names the old place fails here instead of in a
newcomer's browser. Links inside code blocks and inline code are text, not links, and are skipped;
so are links that leave the repository (a scheme such as https:, or mailto:).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """The text with code blocks and inline code removed: what a Markdown renderer links."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8")))}


def broken_links(path: Path) -> list[str]:
    """Each relative link in `path` whose file, or heading within it, does not exist."""
    broken = []
    for target in _LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # https:, mailto:, ...: outside the repository
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert broken_links(doc) == []


def test_the_readme_fits_its_limit():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_the_readme_layout_names_every_package():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # Every folder of Python modules, namespace packages (no __init__.py, such as train/) too.
    packages = sorted({p.parent.name for p in (ROOT / "evotrainer").glob("*/*.py")})
    assert packages, "no packages found under evotrainer/"
    missing = [name for name in packages if not re.search(rf"^evotrainer/{name}/ ", readme, re.MULTILINE)]
    assert missing == [], f"README.md's layout lacks {missing}"


def test_a_missing_file_or_heading_is_found_and_code_is_not_read_as_links(tmp_path):
    (tmp_path / "there.md").write_text("# A heading: with `code`, punctuation\n\ntext\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](there.md) [ok too](there.md#a-heading-with-code-punctuation) [self](#local)\n"
        "## Local\n"
        "[gone](missing.md) and ![image](img/none.png) and [bad anchor](there.md#nope)\n"
        "[web](https://example.invalid/x.md) `[not a link](nowhere.md)`\n"
        "```\n[in a block](nowhere-either.md)\n```\n")
    assert broken_links(doc) == ["missing.md: no such file", "img/none.png: no such file",
                                 "there.md#nope: no heading #nope in there.md"]

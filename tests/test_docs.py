"""docs/ stays true: every refusal code the code cites has a row, every cited section exists.

The format and platform are documented in this repository (docs/format.md, docs/platform.md);
code and config cite their numbered sections, always naming the file (a bare section mark
outside the two is caught). A code added in a comment or message without
a row in docs/format.md §14 fails here, with the row to add.
"""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = {name: (REPO / "docs" / f"{name}.md").read_text(encoding="utf-8")
        for name in ("format", "platform")}
CODE = re.compile(r"\b([VCR])(\d{1,2})\b")
ROW = re.compile(r"^\| ([VCR]\d{1,2}) \|", re.M)
SECTION = r"§\d+(?:\.\d+)?"
# ``docs/format.md §6.2``, ``docs/format.md §6.2, §6.4`` or ``[docs/platform.md](…) §7``.
CITATION = re.compile(rf"(?:docs/)?(format|platform)\.md(?:\]\([^)]*\))? "
                      rf"({SECTION}(?:(?:, | and |–){SECTION})*)")


def _sources(*folders: str, suffixes=(".py",)) -> list[Path]:
    return [p for folder in folders for p in (REPO / folder).rglob("*")
            if p.suffix in suffixes and p.is_file()]


def _cited_codes() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in _sources("causalab"):
        for letter, number in CODE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(letter + number, str(path.relative_to(REPO)))
    return found


def _sections(text: str) -> set[str]:
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.M))


def test_every_refusal_code_the_code_cites_has_a_row_in_the_refusal_tables():
    cited = _cited_codes()
    documented = set(ROW.findall(DOCS["format"]))
    assert len(cited) >= 20 and len(documented) >= 50
    missing = sorted(set(cited) - documented)
    rows = "\n".join(f"| {code} | (to be described; cited in {cited[code]}) | |"
                     for code in missing)
    assert not missing, f"add to docs/format.md §14:\n{rows}"


def _citations(text: str, path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """The (doc, section) pairs a file cites, and its bare ``§`` marks: a ``§`` outside a
    citation, which in docs/format.md or docs/platform.md cites a section of that file."""
    cited, covered = [], set()
    for match in CITATION.finditer(text):
        cited += [(match.group(1), n) for n in re.findall(r"§(\d+(?:\.\d+)?)", match.group(2))]
        covered.update(range(*match.span()))
    bare = []
    for mark in re.finditer(r"§(\d+(?:\.\d+)?)?", text):
        if mark.start() in covered:
            continue
        if path.parent.name == "docs" and path.stem in DOCS and mark.group(1):
            cited.append((path.stem, mark.group(1)))
        else:
            line = text.count("\n", 0, mark.start()) + 1
            bare.append(f"{path.relative_to(REPO)}:{line}: {mark.group(0)}")
    return cited, bare


def _citations_in(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    return _citations(path.read_text(encoding="utf-8"), path)


def _cited_files() -> list[Path]:
    files = _sources("causalab", "conf", "scripts", "tests", suffixes=(".py", ".yaml"))
    files += [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
    return [p for p in files if p != Path(__file__).resolve()]


def test_every_cited_docs_section_exists():
    sections = {name: _sections(text) for name, text in DOCS.items()}
    dangling = sorted({f"{p.relative_to(REPO)}: docs/{doc}.md §{number}"
                       for p in _cited_files() for doc, number in _citations_in(p)[0]
                       if number not in sections[doc]})
    assert not dangling, dangling


def test_every_section_mark_outside_the_docs_names_its_doc():
    bare = [mark for p in _cited_files() for mark in _citations_in(p)[1]]
    assert not bare, bare


def test_a_bare_section_mark_is_caught_and_a_listed_one_is_cited():
    text = "see (§6.2) and docs/format.md §6.5 and docs/platform.md §7, §5"
    cited, bare = _citations(text, REPO / "causalab" / "probe.py")
    assert cited == [("format", "6.5"), ("platform", "7"), ("platform", "5")]
    assert len(bare) == 1 and "§6.2" in bare[0]


def test_the_readme_points_at_docs_and_not_outside_the_repository():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/format.md" in readme and "docs/platform.md" in readme
    assert "../shared" not in readme


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces made ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """The links and images of a Markdown page that do not resolve: a relative path that is
    not a file or folder of the checkout, or an ``#anchor`` no heading of its page makes."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https://…, mailto:
            continue
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        if not found.exists() or root not in (found, *found.parents):
            broken.append(f"{page.relative_to(root)}: {target} (no such file here)")
        elif anchor and found.suffix == ".md" and anchor not in _anchors(found):
            broken.append(f"{page.relative_to(root)}: {target} (no heading #{anchor})")
    return broken


def test_every_link_of_the_readme_and_the_docs_pages_resolves():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    readme = LINK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(readme) >= 10 and any(t.endswith(".png") for t in readme)
    broken = [line for page in pages for line in broken_links(page)]
    assert not broken, broken


def test_a_missing_file_and_a_missing_heading_are_caught(tmp_path):
    assert _anchor("Four workflows") == "four-workflows"
    assert _anchor("What `make run` shows") == "what-make-run-shows"
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Title\n\n## Four workflows\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[a](nowhere.md) [b](../README.md#no-such-heading) [c](https://x.org)\n"
                    "[d](../README.md#four-workflows) ![e](../README.md) [f](#title-here)\n"
                    "# Title here\n```\n[g](inside-a-block.md)\n```\n")
    assert broken_links(page, tmp_path) == [
        "docs/page.md: nowhere.md (no such file here)",
        "docs/page.md: ../README.md#no-such-heading (no heading #no-such-heading)"]


def test_the_readme_is_a_guide_its_first_line_says_what_causalab_is():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, len(lines)
    assert lines[0].startswith("# causalab") and "causal interventions" in lines[0]
    text = "\n".join(lines)
    assert "make run" in text and "make test" in text and "docs/images/" in text

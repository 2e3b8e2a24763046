"""docs/ stays true: every refusal code the code cites has a row, every cited section exists.

The format and platform are documented in this repository (docs/format.md, docs/platform.md);
code and config cite their numbered sections. A code added in a comment or message without
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
CITATION = re.compile(r"docs/(format|platform)\.md §(\d+(?:\.\d+)?)")


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


def test_every_cited_docs_section_exists():
    sections = {name: _sections(text) for name, text in DOCS.items()}
    files = _sources("causalab", "conf", "scripts", "tests", suffixes=(".py", ".yaml"))
    files += [REPO / "README.md", REPO / "docs" / "README.md"] + [
        REPO / "docs" / f"{name}.md" for name in DOCS]
    dangling = sorted({f"{p.relative_to(REPO)}: docs/{doc}.md §{number}"
                       for p in files for doc, number in CITATION.findall(p.read_text())
                       if number not in sections[doc]})
    assert not dangling, dangling


def test_the_readme_points_at_docs_and_not_outside_the_repository():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/format.md" in readme and "docs/platform.md" in readme
    assert "../shared" not in readme

"""The README is a guide (at most 400 lines) and the docs hold together: every relative link in README.md and
docs/**/*.md points to a file that exists (and, with an anchor, to a heading of it), and every docs/*.md page
the code, Makefile and configs cite exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")
CITED = re.compile(r"\bdocs/[\w./-]+\.md\b")
CODE_DIRS = (
    "agpo",
    "student",
    "evaluation",
    "durable",
    "compute",
    "pipelines",
    "dags",
    "deploy",
    "benchmarks",
    "tests",
    "configs",
)


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a link inside one is not a link)."""
    kept, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown page."""
    slugs = set()
    for line in prose(path).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return slugs


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_the_readme_is_a_guide_of_at_most_400_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move the detail into docs/ and link to it"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(page):
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve()
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_the_pages_the_code_cites_exist():
    files = [p for d in CODE_DIRS for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".yaml", ".sh"}]
    files.append(ROOT / "Makefile")
    missing = {
        f"{path.relative_to(ROOT)}: {cited}"
        for path in files
        for cited in CITED.findall(path.read_text(encoding="utf-8"))
        if not (ROOT / cited).exists()
    }
    assert not missing, sorted(missing)

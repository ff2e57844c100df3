"""README and docs: every import and dotted name they show resolves; nothing cites a file outside the repo."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SOURCES = [p for d in ("adwin", "controller", "probes", "trainer_adapters", "tests", "configs", "docs")
           for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".md", ".yaml", ".html")]

FROM_IMPORT = re.compile(r"^\s*from (adwin[\w.]*) import ([\w, ]+?)\s*(?:#.*)?$", re.M)
DOTTED = re.compile(r"`(adwin(?:\.\w+)+)")  # a backticked dotted name, up to any call or space


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _current_text(doc: Path) -> str:
    """The doc without the "old path" column of move tables (decisions.md, "Layout"): those name what was."""
    out, in_moves = [], False
    for line in doc.read_text().splitlines():
        if line.startswith("| old path |"):
            in_moves = True
        elif not line.startswith("|"):
            in_moves = False
        out.append("|" + line.split("|", 2)[2] if in_moves and line.count("|") >= 3 else line)
    return "\n".join(out)


def _resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names: the longest importable prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def _shown_imports() -> list[tuple[str, str, str]]:
    return [(_rel(doc), m.group(1), name.strip()) for doc in DOCS for m in FROM_IMPORT.finditer(_current_text(doc))
            for name in m.group(2).split(",") if name.strip()]


def _shown_names() -> list[tuple[str, str]]:
    return sorted({(_rel(doc), m.group(1)) for doc in DOCS for m in DOTTED.finditer(_current_text(doc))})


@pytest.mark.parametrize(("doc", "module", "name"), _shown_imports())
def test_every_import_shown_in_the_docs_works(doc: str, module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{doc}: from {module} import {name} fails"


@pytest.mark.parametrize(("doc", "dotted"), _shown_names())
def test_every_dotted_adwin_name_in_the_docs_resolves(doc: str, dotted: str) -> None:
    try:
        _resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{doc}: `{dotted}` does not resolve ({e})")


def test_nothing_cites_a_design_file_or_papers_outside_the_repository() -> None:
    outside = re.compile(r"DESIGN\.md|shared/seeds|\.\./shared/")
    here = Path(__file__).resolve()
    bad = [f"{_rel(p)}:{i}" for p in SOURCES if p.resolve() != here
           for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert not bad, f"cite docs/design.md or the paper by title instead: {bad}"


def test_the_design_doc_exists_and_the_readme_links_it() -> None:
    assert (ROOT / "docs" / "design.md").is_file()
    assert "(docs/design.md)" in (ROOT / "README.md").read_text()


PATH_SHOWN = re.compile(r"\b((?:adwin|controller|probes|trainer_adapters|configs|tests)/[\w/.-]*\w\.(?:py|yaml))")


def test_every_repository_file_the_docs_name_exists() -> None:
    missing = sorted({f"{_rel(doc)}: {m.group(1)}" for doc in DOCS for m in PATH_SHOWN.finditer(_current_text(doc))
                      if not (ROOT / m.group(1)).is_file()})
    assert not missing, f"the docs name files that are not in the repository: {missing}"


TEST_SHOWN = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_test_the_docs_name_exists() -> None:
    missing = sorted({f"{_rel(doc)}: {m.group(0)}" for doc in DOCS for m in TEST_SHOWN.finditer(_current_text(doc))
                      if not (ROOT / m.group(1)).is_file()
                      or f"def {m.group(2)}(" not in (ROOT / m.group(1)).read_text()})
    assert not missing, f"the docs name tests that do not exist: {missing}"


# The docs describe the product, not the work: history lives in git.
WORK_WORDS = re.compile(r"\bsessions? \d|\b(?:this|that|each|every|a|one|another|earlier|later|next|previous) session\b"
                        r"|\bsession's\b|\bissues? \d+\b|(?<![\w&])#\d+\b|/tmp/|\bsprint\b", re.I)


@pytest.mark.parametrize("doc", [_rel(d) for d in DOCS])
def test_no_page_speaks_of_work_periods_tracker_numbers_or_tmp_paths(doc: str) -> None:
    text = (ROOT / doc).read_text()
    bad = [f"{doc}:{i}: {m.group(0)!r}" for i, line in enumerate(text.splitlines(), 1)
           for m in WORK_WORDS.finditer(line)]
    assert not bad, f"say it as what the product does, pinned to a commit where it is a measurement: {bad[:10]}"


def test_every_doc_page_is_linked_from_the_readme_or_the_design_doc() -> None:
    hubs = (ROOT / "README.md").read_text() + (ROOT / "docs" / "design.md").read_text()
    orphans = [_rel(d) for d in DOCS[1:] if d.name != "design.md" and d.name not in hubs]
    assert not orphans, f"link these pages from README.md or docs/design.md: {orphans}"


SECTION_CITED = re.compile(r"docs/(\w+\.md),?\s+\"([^\"]+)\"")


def _headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip().strip("`") for line in doc.read_text().splitlines() if line.startswith("#")]


def test_every_cited_section_of_a_doc_exists() -> None:
    """``docs/benchmarks.md, "Probe workers"``: a heading of that page starts with the cited words."""
    bad = []
    for p in SOURCES + [ROOT / "README.md"]:
        # a citation may wrap across comment lines (``# ...`` in YAML and Python)
        text = " ".join(re.sub(r"\n\s*#+\s*", " ", p.read_text(errors="replace")).split())
        for m in SECTION_CITED.finditer(text):
            page = ROOT / "docs" / m.group(1)
            if page.is_file() and not any(h.startswith(m.group(2).strip("`")) for h in _headings(page)):
                bad.append(f"{_rel(p)}: {m.group(1)} \"{m.group(2)}\"")
    assert not bad, f"these cite sections that do not exist: {sorted(set(bad))}"


def test_the_readme_and_the_benchmarks_page_stay_readable_in_length() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    # the current result of each bench, tables first; regression checks and earlier runs live in docs/dev/
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) <= 700


def test_no_table_is_cut_in_two_by_a_blank_line() -> None:
    """A table row after a blank line that follows a table renders as plain text."""
    bad = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for i in range(2, len(lines)):
            if lines[i].startswith("|") and not lines[i - 1].strip() and lines[i - 2].startswith("|") \
                    and not (i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-: ")):
                bad.append(f"{_rel(doc)}:{i + 1}")
    assert not bad, f"table rows after a blank line, cut off from their table: {bad}"

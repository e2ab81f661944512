"""Comments cite only what a clone has: `docs/upstream.md §N` (the upstream facts, each with its
upstream source) or another file of the repository, never the research notes that lived outside it
(the workspace folder next to the clone, SHARED below)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "docs" / "upstream.md"
# The folder outside the clone that nothing may cite, spelled in parts so that a search of the
# repository for it finds only files that depend on it, not this check.
SHARED = "../" + "shared"
SCOPE = ("operator", "deviceplugin", "hook", "charts", "bench", "e2e", "tests")
SKIP_DIRS = {"__pycache__", "build", ".venv", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
SUFFIXES = {".py", ".pyi", ".c", ".h", ".sh", ".md", ".yaml", ".yml", ".tpl", ".toml", ".txt", ".proto",
            ".json", ".cfg", ".ini"}
# The notes the code once cited; they were never part of the repository.
RESEARCH_NOTES = ("anchors.md", "volcano-scheduler.md", "device-plugin.md", "kopf-kmock.md", "hami-core.md",
                  "gpu-h100.md", "real-cluster.md")
MD_SECTION = re.compile(r"([\w./-]+\.md)\s*§\s*(\d+(?:\.\d+)?)")
SECTION = re.compile(r"§\s*\d")


def source_files() -> Iterator[Path]:
    for top in SCOPE:
        for path in sorted((ROOT / top).rglob("*")):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] == ("tests", "fixtures") or SKIP_DIRS.intersection(relative.parts):
                continue
            if path == Path(__file__).resolve():  # this file names what it looks for
                continue
            if path.is_file() and (path.suffix in SUFFIXES or path.name in ("Makefile", "Dockerfile")):
                yield path


def upstream_sections(text: str) -> set[str]:
    """`N` for each `## N. title`, `N.M` for each `### N.M title` and each numbered item `M.` of
    section N."""
    found: set[str] = set()
    current = ""
    for line in text.splitlines():
        if heading := re.match(r"##\s+(\d+)\.\s", line):
            current = heading[1]
            found.add(current)
        elif sub := re.match(r"###\s+(\d+\.\d+)\s", line):
            found.add(sub[1])
        elif current and (item := re.match(r"(\d+)\.\s", line)):
            found.add(f"{current}.{item[1]}")
    return found


def problems_in(path: Path, sections: set[str]) -> Iterator[str]:
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        where = f"{path.relative_to(ROOT)}:{number}"
        if re.search(r"\bresearch\b|\.\./shared\b", line, re.IGNORECASE):
            yield f"{where}: cites the research notes, which are not in the repository: {line.strip()}"
            continue
        for note in RESEARCH_NOTES:
            if re.search(rf"(?<![\w/-]){re.escape(note)}", line):
                yield f"{where}: cites {note}, which is not in the repository: {line.strip()}"
        cited = list(MD_SECTION.finditer(line))
        if SECTION.search(line) and not cited:
            yield f"{where}: a bare § with no file: name docs/upstream.md (or the repo file): {line.strip()}"
        for match in cited:
            name, section = match[1], match[2]
            if name.endswith("docs/upstream.md") or name == "upstream.md":
                if section not in sections:
                    yield f"{where}: docs/upstream.md has no §{section}"
            elif not ((path.parent / name).is_file() or (ROOT / name).is_file()):
                yield f"{where}: {name} §{section} is not a file of the repository"


def test_comments_cite_only_files_in_the_repository() -> None:
    sections = upstream_sections(UPSTREAM.read_text())
    files = list(source_files())
    assert len(files) > 100, "the scope is empty: did the layout change?"
    found = [problem for path in files for problem in problems_in(path, sections)]
    assert not found, "\n".join(found)


def test_upstream_md_gives_upstream_sources_not_the_research_notes() -> None:
    text = UPSTREAM.read_text()
    assert {"1", "2", "3", "4", "5", "6", "7", "1.1", "6.1", "6.8", "7.2"} <= upstream_sections(text)
    assert "research/" not in text and SHARED not in text
    assert not [note for note in RESEARCH_NOTES if note in text]
    for heading in re.findall(r"^## (\d+)\..*$", text, re.MULTILINE):
        body = text.split(f"\n## {heading}.", 1)[1].split("\n## ", 1)[0]
        assert "Source:" in body, f"§{heading} names no upstream source"


def test_the_check_catches_each_kind_of_bad_citation(tmp_path: Path) -> None:
    sample = ROOT / "tests" / "packaging" / "_citation_sample.py"  # reported relative to the root
    lines = ["# research volcano-scheduler.md §1.1", f"# see {SHARED}/notes", "# the order (§3.5)",
             "# docs/upstream.md §99", "# nowhere/missing.md §2", "# docs/upstream.md §6.4 is fine",
             "# kopf-kmock.md gaps"]
    try:
        sample.write_text("\n".join(lines) + "\n")
        found = list(problems_in(sample, upstream_sections(UPSTREAM.read_text())))
    finally:
        sample.unlink()
    assert [p.split(":", 2)[1] for p in found] == ["1", "2", "3", "4", "5", "7"], found

"""The README and docs/ hold together: every relative link and anchor resolves, the README stays a
front door, each docs page opens with an example that compiles, and every option an example sets
exists.

Anchors follow GitHub's heading slugs: lower case; characters other than letters, digits, spaces,
hyphens and underscores dropped (inline code keeps its text, links keep theirs); each space a
hyphen; a repeated slug gets ``-1``, ``-2``, ... Links inside fenced code blocks and inline code
are not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pyspark_jetstream.tools.docs import TABLES

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOC_PAGES = sorted(DOCS.glob("*.md"))
TOPIC_PAGES = [p for p in DOC_PAGES if p.name != "README.md"]  # the index has no example
MARKDOWN = [README, *DOC_PAGES]

EXPECTED_PAGES = {"README.md", "source.md", "sink.md", "kv.md", "guarantees.md", "operations.md",
                  "sql-and-connect.md", "clusters-and-platforms.md", "security.md", "performance.md",
                  "troubleshooting.md", "architecture.md"}

SPARK_OPTIONS = {"checkpointlocation"}  # Spark's own writeStream options, set with .option() too

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
_OPTION = re.compile(r"""\.option\(\s*(["'])([^"']+)\1""")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def github_slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w: letters, digits and underscores, in any script
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose_lines(path.read_text()):
        anchors.update(_HTML_ANCHOR.findall(line))
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def links_of(path: Path) -> list[str]:
    targets = []
    for line in _prose_lines(path.read_text()):
        line = re.sub(r"(`+)(?:(?!\1).)+\1", "code", line)  # inline code holds no links
        targets += [m.group(2) for m in _LINK.finditer(line)]
    return targets


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in links_of(path):
        if re.match(r"(?i)(https?:|mailto:)", target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors_of(resolved)):
            broken.append(f"{path.relative_to(root)}: {target} (no heading with that anchor)")
    return broken


def test_the_docs_pages_are_there():
    assert {p.name for p in DOC_PAGES} >= EXPECTED_PAGES


def test_the_slug_rules():
    assert github_slug("Keeping each key's newest row (`sequenceBy`)") == "keeping-each-keys-newest-row-sequenceby"
    assert github_slug("Splits: order per subject") == "splits-order-per-subject"
    assert github_slug("Output modes, and writes from threads") == "output-modes-and-writes-from-threads"
    assert github_slug("Stream management (`ensureStream`)") == "stream-management-ensurestream"
    assert github_slug("KV writes with `sequenceBy` -- and a_b") == "kv-writes-with-sequenceby----and-a_b"


def test_the_link_rules(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Notes\n\n## Notes\n\n```\n[in a fence](missing.md)\n```\n\n"
                    "`[in code](missing.md)` [one](#notes) [two](#notes-1) [three](#notes-2) [web](https://x.y/#z)\n")
    assert anchors_of(page) == {"notes", "notes-1"}
    assert broken_links(page, tmp_path) == ["page.md: #notes-2 (no heading with that anchor)"]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path):
    assert links_of(path), "a page without links is not part of the documentation"
    assert broken_links(path) == []


def test_the_readme_is_a_front_door():
    lines = README.read_text().count("\n")
    assert lines < 300, f"README.md has {lines} lines: move reference material into docs/"
    linked = {Path(t.partition("#")[0]).name for t in links_of(README) if t.startswith("docs/")}
    assert EXPECTED_PAGES - {"README.md"} <= linked, "the README links every docs page"


def test_architecture_draws_the_layers_and_the_micro_batch():
    blocks = _code_blocks((DOCS / "architecture.md").read_text(), "mermaid")
    assert len(blocks) >= 2
    layers = next(b for b in blocks if b.lstrip().startswith("flowchart"))
    for room in ("protocol/", "options/", "client/", "spark_api", "source/", "sink/", "datasource", "progress",
                 "tools/", "errors", "logs", "threads", "task_notes"):
        assert room in layers, room
    micro_batch = next(b for b in blocks if b.lstrip().startswith("sequenceDiagram"))
    for step in ("latestOffset", "partitions", "pull", "Arrow", "publish", "PubAck", "commit"):
        assert step in micro_batch, step


@pytest.mark.parametrize("path", TOPIC_PAGES, ids=lambda p: p.name)
def test_each_docs_page_opens_with_a_python_example_that_compiles(path):
    text = path.read_text()
    assert text.startswith("# "), "a page starts with its title"
    head = text.split("\n## ", 1)[0]  # before the first section
    examples = _code_blocks(head, "python")
    assert examples, "a page opens with a short runnable example, before its first section"
    compile(examples[0], f"{path.name}: first python block", "exec")
    assert "jetstream" in examples[0]


def test_every_option_an_example_sets_exists():
    known = {spec.name.lower() for specs in TABLES.values() for spec in specs} | SPARK_OPTIONS
    unknown, used = [], 0
    for path in MARKDOWN:
        for block in _code_blocks(path.read_text(), "python"):
            for _, name in _OPTION.findall(block):
                used += 1
                if name.lower() not in known:
                    unknown.append(f"{path.relative_to(ROOT)}: .option({name!r}, ...)")
    assert used > 50
    assert unknown == []


def test_the_readme_option_tables_name_real_options():
    known = {spec.name.lower() for specs in TABLES.values() for spec in specs}
    options, in_table = [], False
    for line in _prose_lines(README.read_text()):
        if not line.startswith("|"):
            in_table = False
        elif line.startswith("| option |"):
            in_table = True
        elif in_table and (name := re.match(r"\| `([^`]+)` \|", line)):
            options.append(name.group(1))
    assert len(options) >= 10
    assert [n for n in options if n.lower() not in known] == []

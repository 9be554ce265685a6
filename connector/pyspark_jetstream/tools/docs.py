"""Generate the documentation's option tables from the option definitions.

    python -m pyspark_jetstream.tools.docs            # rewrite the tables in README.md and docs/*.md
    python -m pyspark_jetstream.tools.docs --check    # exit 1 when any of them is out of date
    python -m pyspark_jetstream.tools.docs --check docs/source.md ...  # only these files

Run it from the repository's root. Each table sits between ``<!-- options:NAME -->`` and
``<!-- /options:NAME -->`` (NAME: ``connection``, ``source``, ``sink``, ``kv_sink`` or ``lookup``) in whichever
Markdown file documents it; every table must be in at least one of the files given (or found), and
a block naming no known table is an error. A test runs the check, so the documentation and the code
cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

from ..options import (
    CONNECTION_OPTIONS,
    KV_SINK_OPTIONS,
    LOOKUP_OPTIONS,
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    OptionSpec,
)

TABLES: dict[str, tuple[OptionSpec, ...]] = {
    "connection": CONNECTION_OPTIONS,
    "sink": SINK_OPTIONS,
    "kv_sink": KV_SINK_OPTIONS,
    "source": SOURCE_OPTIONS,
    "lookup": LOOKUP_OPTIONS,
}

# A marker is a line of its own (one quoted in a sentence or in inline code is not a marker).
_OPENING = re.compile(r"^<!-- options:([\w.-]+) -->$", re.M)
_BLOCK = re.compile(r"^(<!-- options:([\w.-]+) -->\n).*?^(<!-- /options:\2 -->)$", re.S | re.M)


def markdown_table(specs: tuple[OptionSpec, ...]) -> str:
    lines = ["| option | default | meaning | allowed |", "|---|---|---|---|"]
    for spec in specs:
        default = f"`{spec.default}`" if spec.default is not None else "none"
        allowed = spec.allowed.removeprefix("Expected ").rstrip(".")
        lines.append(f"| `{spec.name}` | {default} | {spec.doc} | {allowed} |".replace("\n", " "))
    return "\n".join(lines)


def tables_in(text: str) -> list[str]:
    """The names of the option blocks ``text`` holds, in order."""
    return [m.group(2) for m in _BLOCK.finditer(text)]


def render(text: str) -> str:
    """``text`` with every option block it holds regenerated (a text without blocks is returned as it is).

    Raises ``ValueError`` for a block naming no known table and for an opening marker without its
    closing one.
    """
    opened = _OPENING.findall(text)
    names = tables_in(text)
    if len(opened) != len(names):
        unclosed = sorted(set(opened) - set(names)) or sorted(set(opened))
        raise ValueError(f"option block(s) without a closing <!-- /options:NAME -->: {', '.join(unclosed)}")
    unknown = sorted(set(names) - set(TABLES))
    if unknown:
        raise ValueError(f"unknown option table(s) {', '.join(unknown)}; known: {', '.join(TABLES)}")
    return _BLOCK.sub(lambda m: m.group(1) + markdown_table(TABLES[m.group(2)]) + "\n" + m.group(3), text)


def markdown_files(root: Path) -> list[Path]:
    """The documentation under ``root`` (the repository): ``README.md`` and ``docs/*.md``."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted((root / "docs").glob("*.md"))


def render_files(paths: Iterable[Path]) -> dict[Path, tuple[str, str]]:
    """``{path: (text, rendered)}`` for every file that holds a block; raises ``ValueError`` when a
    table is in none of them."""
    out: dict[Path, tuple[str, str]] = {}
    seen: set[str] = set()
    for path in paths:
        text = path.read_text()
        try:
            rendered = render(text)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        names = tables_in(text)
        if names:
            seen.update(names)
            out[path] = (text, rendered)
    missing = [name for name in TABLES if name not in seen]
    if missing:
        raise ValueError(f"no <!-- options:NAME --> block for {', '.join(missing)} in any of the files")
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if not a.startswith("--")] or markdown_files(Path.cwd())
    if not paths:
        print("no README.md or docs/*.md here: run from the repository's root, or name the files")
        return 2
    try:
        files = render_files(paths)
    except ValueError as e:
        print(e)
        return 1
    stale = [path for path, (text, rendered) in files.items() if rendered != text]
    if check:
        for path in stale:
            print(f"{path}: option tables are out of date; run python -m pyspark_jetstream.tools.docs")
        return 1 if stale else 0
    for path in stale:
        path.write_text(files[path][1])
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Generate the README's option tables from the option definitions.

    python -m pyspark_jetstream.tools.docs README.md     # rewrite the tables in place
    python -m pyspark_jetstream.tools.docs --check README.md

Each table sits between ``<!-- options:NAME -->`` and ``<!-- /options:NAME -->``;
a test runs the check so the README and the code cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..options import CONNECTION_OPTIONS, KV_SINK_OPTIONS, SINK_OPTIONS, SOURCE_OPTIONS, OptionSpec

TABLES: dict[str, tuple[OptionSpec, ...]] = {
    "connection": CONNECTION_OPTIONS,
    "sink": SINK_OPTIONS,
    "kv_sink": KV_SINK_OPTIONS,
    "source": SOURCE_OPTIONS,
}


def markdown_table(specs: tuple[OptionSpec, ...]) -> str:
    lines = ["| option | default | meaning | allowed |", "|---|---|---|---|"]
    for spec in specs:
        default = f"`{spec.default}`" if spec.default is not None else "none"
        allowed = spec.allowed.removeprefix("Expected ").rstrip(".")
        lines.append(f"| `{spec.name}` | {default} | {spec.doc} | {allowed} |".replace("\n", " "))
    return "\n".join(lines)


def render(text: str) -> str:
    for name, specs in TABLES.items():
        pattern = re.compile(rf"(<!-- options:{name} -->\n).*?(<!-- /options:{name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- options:{name} --> block")
        text = pattern.sub(lambda m, s=specs: m.group(1) + markdown_table(s) + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if not a.startswith("--")] or ["README.md"]
    path = Path(paths[0])
    text = path.read_text()
    rendered = render(text)
    if check:
        if rendered != text:
            print(f"{path}: option tables are out of date; run python -m pyspark_jetstream.tools.docs {path}")
            return 1
        return 0
    path.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

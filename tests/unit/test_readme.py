"""The documentation's option tables are generated from the option definitions, and the README
starts with the two commands CI runs."""

from pathlib import Path

import pytest

from pyspark_jetstream.tools.docs import TABLES, markdown_files, render, render_files, tables_in

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_option_tables_match_the_code():
    files = render_files(markdown_files(ROOT))
    stale = [str(path.relative_to(ROOT)) for path, (text, rendered) in files.items() if rendered != text]
    assert stale == [], "run: python -m pyspark_jetstream.tools.docs"


def test_every_option_table_is_in_exactly_one_place_under_docs():
    found = {path.relative_to(ROOT).as_posix(): tables_in(path.read_text()) for path in markdown_files(ROOT)}
    places = sorted(f"{name} in {path}" for path, names in found.items() for name in names)
    assert sorted(name for names in found.values() for name in names) == sorted(TABLES), places
    assert all(path.startswith("docs/") for path, names in found.items() if names), places


def test_the_generator_refuses_unknown_unclosed_and_missing_tables(tmp_path):
    with pytest.raises(ValueError, match="unknown option table"):
        render("<!-- options:nope -->\n<!-- /options:nope -->\n")
    with pytest.raises(ValueError, match="without a closing"):
        render("<!-- options:sink -->\n| stale |\n")
    page = tmp_path / "page.md"
    page.write_text("<!-- options:sink -->\n<!-- /options:sink -->\n")
    with pytest.raises(ValueError, match="connection"):
        render_files([page])
    assert "`ensureStream`" in render(page.read_text())


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    blocks = [b.split("```")[0].strip() for b in text.split("```bash\n")[1:3]]
    assert blocks[0].endswith("examples/quickstart.py") and "pip install -e '.[spark,server]'" in blocks[0]
    assert blocks[1].endswith("python -m pytest") and "pip install -e '.[test]'" in blocks[1]
    assert blocks[1] in (README.parent / ".ci" / "run").read_text()

"""The README's option tables are generated from the option definitions."""

from pathlib import Path

from pyspark_jetstream.tools.docs import render

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_option_tables_match_the_code():
    text = README.read_text()
    assert render(text) == text, "run: python -m pyspark_jetstream.tools.docs README.md"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    blocks = [b.split("```")[0].strip() for b in text.split("```bash\n")[1:3]]
    assert blocks[0].endswith("examples/quickstart.py") and "pip install -e '.[spark,server]'" in blocks[0]
    assert blocks[1].endswith("python -m pytest") and "pip install -e '.[test]'" in blocks[1]
    assert blocks[1] in (README.parent / ".ci" / "run").read_text()

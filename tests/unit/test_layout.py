"""The package's layout keeps its promises (README, "Architecture").

- ``protocol/`` is pure: it imports the standard library, its own modules and
  ``errors`` only: never nats-py, pyspark, pyarrow, nor the I/O sub-packages
  (the sink's options type may be named for annotations, under ``TYPE_CHECKING``).
- ``tools/`` is not imported by the data path (``source/``, ``sink/``, ``client/``,
  ``protocol/`` and the Spark-facing ``datasource``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pyspark_jetstream

PACKAGE = Path(pyspark_jetstream.__file__).resolve().parent


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """Imports under ``if TYPE_CHECKING:``: annotations only, never run."""
    return {child for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
            "TYPE_CHECKING" for child in ast.walk(node)}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import ``path`` runs: level 0 for absolute imports."""
    found = []
    tree = ast.parse(path.read_text())
    annotations_only = _type_checking_only(tree)
    for node in ast.walk(tree):
        if node in annotations_only:
            continue
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module is None:  # from . import x, y
                found += [(node.level, alias.name) for alias in node.names]
            else:
                found.append((node.level, node.module))
    return found


def test_protocol_imports_only_the_standard_library_itself_and_errors():
    modules = sorted((PACKAGE / "protocol").glob("*.py"))
    assert len(modules) >= 4
    offenders = []
    for path in modules:
        for level, module in _imports(path):
            top = module.split(".")[0]
            pure = (level == 0 and top in sys.stdlib_module_names) or (level == 1) or \
                (level == 2 and module == "errors")
            if not pure:
                offenders.append(f"protocol/{path.name}: {'.' * level}{module}")
    assert offenders == []


def test_the_data_path_never_imports_tools():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "tools" or relative.name in ("server.py", "pack.py"):
            continue  # the tools and their documented entry points
        for level, module in _imports(path):
            if "tools" in module.split(".") or module.startswith("pyspark_jetstream.tools"):
                offenders.append(f"{relative}: {'.' * level}{module}")
    assert offenders == []

"""The package's layout keeps its promises (docs/architecture.md).

Every import counts here, those a function makes when it runs and those under
``TYPE_CHECKING`` too: a circle drawn for the type checker is still a circle a
reader has to follow.

- ``protocol/`` is pure NATS knowledge: it imports the standard library and its own
  modules, nothing else (no nats-py, pyspark or pyarrow, nothing of the connector
  outside ``protocol/``).
- The sub-packages stand in layers, and no module imports one from a layer above its
  own: ``errors``/``logs``/``threads`` < ``protocol`` < ``options`` < ``client``/
  ``spark_api`` < ``source``/``sink`` < ``datasource``/``progress`` < ``tools`` and
  the package's ``__init__``. Two rooms of one layer do not import each other.
- Inside a sub-package the imports form no circle.
- ``tools/`` is not imported by the data path.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pyspark_jetstream

PACKAGE = Path(pyspark_jetstream.__file__).resolve().parent

LAYERS = {
    "errors": 0, "logs": 0, "threads": 0,
    "protocol": 1,
    "options": 2,
    "client": 3, "spark_api": 3, "task_notes": 3,
    "source": 4, "sink": 4,
    "datasource": 5, "progress": 5, "write_check": 5, "lookup": 5,
    "tools": 6, "__init__": 6,
}


def _modules() -> dict[str, Path]:
    """Dotted names inside the package (``sink.task.write``, ``options``, ``__init__``) -> file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if len(parts) > 1 and parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(importer: str, level: int, module: str | None, name: str | None) -> str | None:
    """The package module an import statement in ``importer`` refers to, or None outside the package."""
    if level == 0:
        if not (module or "").startswith("pyspark_jetstream"):
            return None
        target = module.split(".")[1:]
    else:
        is_package = MODULES.get(importer, Path()).name == "__init__.py"
        base = importer.split(".") if importer != "__init__" else []
        base = base if is_package else base[:-1]
        base = base[: len(base) - (level - 1)] if level > 1 else base
        target = base + (module.split(".") if module else [])
    dotted = ".".join(target) or "__init__"
    if name is not None and f"{dotted}.{name}".removeprefix("__init__.") in MODULES:
        return f"{dotted}.{name}".removeprefix("__init__.")  # from . import kv
    return dotted


def imports_of(importer: str) -> set[str]:
    """Every package module ``importer`` imports, wherever the import stands."""
    tree = ast.parse(MODULES[importer].read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [_resolve(importer, 0, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = [_resolve(importer, node.level, node.module, alias.name) for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t is not None and t != importer}
    return found


def outside_imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports outside the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - {"pyspark_jetstream"}


def room(module: str) -> str:
    return module.split(".")[0]


def test_every_module_has_a_layer():
    assert {room(m) for m in MODULES} == set(LAYERS), "give the new room a layer in LAYERS and the architecture page"


def test_protocol_imports_only_the_standard_library_and_itself():
    protocol = [m for m in MODULES if room(m) == "protocol"]
    assert len(protocol) >= 8
    offenders = []
    for module in protocol:
        offenders += [f"{module} -> {t}" for t in imports_of(module) if room(t) != "protocol"]
        offenders += [f"{module} -> {name}" for name in outside_imports(MODULES[module])
                      if name not in sys.stdlib_module_names]
    assert offenders == []


def test_no_module_imports_one_above_it_or_beside_it():
    offenders = []
    for module in MODULES:
        for target in imports_of(module):
            if room(target) == room(module):
                continue
            if LAYERS[room(target)] >= LAYERS[room(module)] and room(module) != "__init__":
                offenders.append(f"{module} (layer {LAYERS[room(module)]}) -> {target} (layer {LAYERS[room(target)]})")
    assert offenders == []


def test_no_circle_inside_a_room():
    graph = {m: {t for t in imports_of(m) if room(t) == room(m)} for m in MODULES}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in path:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt in graph:
                visit(nxt, path + [nxt])

    for module in graph:
        visit(module, [module])
    assert circles == []


def test_the_data_path_never_imports_tools():
    offenders = [f"{m} -> {t}" for m in MODULES if room(m) not in ("tools", "__init__")
                 for t in imports_of(m) if room(t) == "tools"]
    assert offenders == []


# Rooms a reader can hold in mind (issue #40): the limits a module, a class, a function and a folder keep.
MODULE_LINES, CLASS_LINES, FUNCTION_LINES, FOLDER_LINES = 500, 250, 100, 2_500


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def test_modules_classes_and_functions_stay_small():
    offenders = []
    for module, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            offenders.append(f"module {module}: {text.count(chr(10))} lines (at most {MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and _lines(node) > CLASS_LINES:
                offenders.append(f"class {module}.{node.name}: {_lines(node)} lines (at most {CLASS_LINES})")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _lines(node) > FUNCTION_LINES:
                offenders.append(f"function {module}.{node.name}: {_lines(node)} lines (at most {FUNCTION_LINES})")
    assert offenders == []


def test_no_folder_holds_more_than_a_few_thousand_lines_of_its_own():
    folders: dict[Path, int] = {}
    for path in MODULES.values():
        folders[path.parent] = folders.get(path.parent, 0) + path.read_text().count("\n")
    offenders = [f"{folder.relative_to(PACKAGE.parent)}: {lines} lines" for folder, lines in folders.items()
                 if lines > FOLDER_LINES]
    assert offenders == [], f"group the folder's modules in subfolders (at most {FOLDER_LINES} lines each)"


# Inside source/ and sink/, the rooms stand in the order a row passes them, and a room imports only rooms
# below it: a stage never reaches back into the task that runs it, nor into the classes Spark calls.
SUB_ROOMS = {
    "source": {"pushdown_reader": 3, "spark_readers": 2, "read": 1, "plan": 0, "columns": 0},
    "sink": {"spark_writers": 4, "task": 3, "plan": 2, "publish": 2, "records": 1, "reduce": 1, "order": 0,
             "encode": 0},
}


def sub_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] in SUB_ROOMS else None


def test_every_module_of_source_and_sink_is_in_a_room():
    rooms = {(room(m), sub_room(m)) for m in MODULES if room(m) in SUB_ROOMS and sub_room(m) is not None}
    assert rooms == {(r, s) for r, subs in SUB_ROOMS.items() for s in subs}, \
        "give the new room a place in SUB_ROOMS and the architecture page"


def test_the_rooms_of_source_and_sink_import_only_the_rooms_below_them():
    offenders = []
    for module in MODULES:
        here = sub_room(module)
        if here is None:
            continue
        levels = SUB_ROOMS[room(module)]
        for target in imports_of(module):
            there = sub_room(target)
            if room(target) != room(module) or there is None or there == here:
                continue
            if levels[there] >= levels[here]:
                offenders.append(f"{module} ({here}, {levels[here]}) -> {target} ({there}, {levels[there]})")
    assert offenders == []

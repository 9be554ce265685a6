"""Pack the connector and nats-py into one zip for ``spark-submit --py-files``.

    python -m pyspark_jetstream.tools.pack dist/pyspark_jetstream_deps.zip

Executors need to import the connector and nats-py, both pure Python, so a zip on
``--py-files`` (or ``spark.submit.pyFiles``) is enough to ship them. What cannot go
in a zip must already be on every node: pyarrow (a compiled package that PySpark's
Python data sources need anyway) and, only for NKey or ``.creds`` authentication,
``nkeys`` with its compiled dependency. The packages are taken from the running
interpreter, so the zip holds exactly the versions the driver uses.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import zipfile
from pathlib import Path

PACKAGES = ("pyspark_jetstream", "nats")


def pack(out: str | Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Write ``out`` with each package's ``.py`` files under its top-level name; return the names."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for package in packages:
            root = Path(importlib.import_module(package).__file__).parent
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed", ".json"):
                    name = f"{package}/{path.relative_to(root).as_posix()}"
                    archive.write(path, name)
                    names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="dist/pyspark_jetstream_deps.zip")
    args = parser.parse_args(argv)
    names = pack(args.out)
    print(f"Wrote {args.out}: {len(names)} files from {', '.join(PACKAGES)}.")
    print(f"Ship it with: spark-submit --py-files {args.out} ... (pyarrow must be installed on every node)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

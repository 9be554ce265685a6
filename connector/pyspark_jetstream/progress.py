"""Reading the source's offsets from a streaming query's progress, on every PySpark.

**Why.** PySpark gives Python sources no metrics hook, so the lag of a query (sequences still to
read) comes from the progress's ``latestOffset`` and ``endOffset``. PySpark 4.2+ shows them as
JSON; 4.0 and 4.1 show a Python source's offsets as a Python ``repr`` (``{'seq': 70}``), and the
micro-batch Spark replays from its log after a restart has no ``latestOffset``. These two functions
read all of those forms.
"""

from __future__ import annotations

import ast
import json
from typing import Any


def parse_offset(text: Any) -> dict | None:
    """An offset as the progress shows it (JSON, or a Python repr on PySpark < 4.2), as a dict;
    None when there is none (``None``, ``"null"``, ``"None"``)."""
    if text is None or text in ("null", "None", ""):
        return None
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        value = ast.literal_eval(text)
    return value if isinstance(value, dict) else None


def lag(source: Any) -> int | None:
    """Sequences a query still has to read after its last micro-batch: the stream's last sequence
    minus the batch's end. ``source`` is ``query.lastProgress["sources"][i]`` (a dict) or a
    ``SourceProgress`` (``query.recentProgress``); None when the progress does not show both."""
    get = source.get if isinstance(source, dict) else lambda name: getattr(source, name, None)
    latest, end = parse_offset(get("latestOffset")), parse_offset(get("endOffset"))
    if latest is None or end is None or "seq" not in latest or "seq" not in end:
        return None
    return int(latest["seq"]) - int(end["seq"])

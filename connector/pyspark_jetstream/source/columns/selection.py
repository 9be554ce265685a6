"""Which columns a read produces: the fixed schema, ``includeHeaders=false``, or a schema the user gives.

**Why.** Every message the sink writes carries headers (``Nats-Msg-Id``, ``Nats-TTL``), so the
``headers`` column (a map of lists) is built for nearly every row of such a stream, and building it
costs more than the rest of the row (in Python, and in Spark turning the Arrow map into its rows),
though few jobs look at it. No PySpark (4.0 to 4.3) tells a Python source which columns a query
uses, so the user says it, the two ways Spark users know: the option ``includeHeaders`` (as Spark's
Kafka source names it) and ``.schema(...)``. A read then builds only its columns. Pure: names and
Spark type strings only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import SchemaError

COLUMNS: tuple[tuple[str, str], ...] = (
    ("subject", "string"), ("data", "binary"), ("headers", "map<string,array<string>>"), ("stream", "string"),
    ("seq", "bigint"), ("timestamp", "timestamp"), ("ttl", "string"), ("expires_at", "timestamp"),
    ("marker_reason", "string"),
)
KV_COLUMNS: tuple[tuple[str, str], ...] = COLUMNS + (("key", "string"), ("operation", "string"))

_DDL_TYPES = {"bigint": "long", "map<string,array<string>>": "map<string, array<string>>"}


def available(kv: bool) -> tuple[tuple[str, str], ...]:
    return KV_COLUMNS if kv else COLUMNS


def default_columns(kv: bool, include_headers: bool) -> tuple[str, ...]:
    return tuple(name for name, _ in available(kv) if include_headers or name != "headers")


def ddl(kv: bool, columns: Sequence[str]) -> str:
    types = dict(available(kv))
    return ", ".join(f"{name} {_DDL_TYPES.get(types[name], types[name])}" for name in columns)


def chosen(kv: bool, fields: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The columns of a schema given to the read (``(name, Spark simpleString)`` pairs), in its order;
    a :class:`SchemaError` naming what is wrong and listing the columns the source has."""
    types = dict(available(kv))
    seen: set[str] = set()
    for name, spark_type in fields:
        if name not in types:
            problem = f"has no column '{name}'"
        elif spark_type.replace(" ", "") != types[name]:
            problem = f"gives column '{name}' as {spark_type}, not {types[name]}"
        elif name in seen:
            problem = f"names column '{name}' twice"
        else:
            seen.add(name)
            continue
        what = "A KV bucket read" if kv else "The JetStream source"
        raise SchemaError(
            f"The schema given to the read {problem}. {what} has these columns (give any of them, in any order): "
            f"{ddl(kv, [n for n, _ in available(kv)])}.")
    if not fields:
        raise SchemaError(f"The schema given to the read has no column; the source has: "
                          f"{ddl(kv, [n for n, _ in available(kv)])}.")
    return tuple(name for name, _ in fields)

"""A batch of rows joined with the values found for its keys, column-wise (pure: no I/O).

The keys of a batch are checked and deduplicated in a few pyarrow passes (:func:`keys_to_fetch`); the
values found (:class:`Found`, one row per live key) are matched to every row by ``index_in`` and taken
(:func:`joined`): no Python per row. A row whose key is null, invalid, missing, deleted, purged or expired
matches nothing: nulls with ``how="left"``, dropped with ``how="inner"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import JetStreamConnectorError

KEY_PATTERN = r"^[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*$"
"""A key that can hold a value: nats-py's rule (protocol/kv.py ``is_valid_key``: letters, digits and ``-/_=.``,
not starting or ending with ``.``) as one regular expression, without two dots in a row (an empty subject
token, which no publish can store)."""


class InvalidKeyError(JetStreamConnectorError):
    """A row's key is null or not a valid KV key, and the lookup's ``invalidKey`` is ``error``."""


def value_fields(prefix: str) -> list[tuple[str, Any]]:
    """The columns a lookup adds: what nats-py's ``kv.get`` gives (value, revision, created)."""
    import pyarrow as pa

    return [(f"{prefix}value", pa.binary()), (f"{prefix}revision", pa.int64()),
            (f"{prefix}created", pa.timestamp("us", tz="UTC"))]


@dataclass(frozen=True)
class Found:
    """The live keys found and their entries, one row each (Arrow arrays of equal length)."""

    keys: Any  # string
    values: Any  # binary
    revisions: Any  # int64
    created: Any  # timestamp[us, UTC]

    @staticmethod
    def empty() -> Found:
        import pyarrow as pa

        return Found(pa.array([], pa.string()), pa.array([], pa.binary()), pa.array([], pa.int64()),
                     pa.array([], pa.timestamp("us", tz="UTC")))

    @staticmethod
    def of_entries(entries: dict[str, tuple[bytes, int, int]]) -> Found:
        """From ``key -> (value, revision, created in microseconds)``."""
        import pyarrow as pa

        keys = list(entries)
        rows = list(entries.values())
        return Found(pa.array(keys, pa.string()), pa.array([r[0] for r in rows], pa.binary()),
                     pa.array([r[1] for r in rows], pa.int64()),
                     pa.array([r[2] for r in rows], pa.timestamp("us", tz="UTC")))

    def entries(self) -> dict[str, tuple[bytes, int, int]]:
        """``key -> (value, revision, created in microseconds)``: what a cache keeps."""
        import pyarrow as pa

        created = self.created.cast(pa.int64()).to_pylist()
        return dict(zip(self.keys.to_pylist(), zip(self.values.to_pylist(), self.revisions.to_pylist(), created,
                                                   strict=True), strict=True))


def valid_keys(column: Any) -> Any:
    """A boolean array: which of ``column``'s keys are valid (a null key is not)."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.match_substring_regex(column, KEY_PATTERN), False)


def keys_to_fetch(column: Any) -> list[str]:
    """The distinct valid keys of ``column``, in their first order."""
    import pyarrow.compute as pc

    return pc.unique(column.filter(valid_keys(column))).to_pylist()


def check_keys(column: Any, first_row: int, key_name: str, where: str = "this task") -> None:
    """``invalidKey=error``: fail naming the first row (its position in the task, ``where``) whose key is null or
    invalid."""
    import pyarrow.compute as pc

    valid = valid_keys(column)
    if pc.all(valid).as_py() in (True, None):
        return
    bad = pc.index(valid, False).as_py()
    key = column[bad].as_py()
    what = "null" if key is None else f"{key!r}, not a valid KV key (letters, digits and '-/_=.', not starting " \
                                      "or ending with '.')"
    raise InvalidKeyError(f"Row {first_row + bad} of {where} has key {what} in column '{key_name}'. Filter such "
                          "rows out, or set the lookup's option invalidKey='null' to give them no value.")


def joined(batch: Any, key_name: str, found: Found, schema: Any, how: str) -> Any:
    """``batch`` with the found entry of each row's key appended (``schema``: the batch's columns and
    :func:`value_fields`); rows with none are kept with nulls (``left``) or dropped (``inner``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    index = pc.index_in(batch.column(key_name), value_set=found.keys)
    columns = [*batch.columns, pc.take(found.values, index), pc.take(found.revisions, index),
               pc.take(found.created, index)]
    out = pa.RecordBatch.from_arrays(columns, schema=schema)
    if how == "inner":
        out = out.filter(pc.is_valid(index))
    return out

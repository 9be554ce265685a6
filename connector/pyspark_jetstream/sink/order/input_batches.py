"""The Arrow batches Spark hands the sink, made safe for every pyarrow call (issue #39).

**Why.** PySpark 4.0 and 4.1 ship arrow-java 18, which writes the offsets buffer of an *empty*
string, binary, list or map vector with 0 bytes instead of the one offset ``[0]`` the format asks
for (apache/arrow-java#343, fixed in arrow-java 19, which PySpark 4.2 ships). A vector is empty
where every value above it is null or empty: in a batch whose rows all have no headers, the
children of the ``headers`` map (its keys, its value lists and their strings) are. pyarrow reads
such a buffer as a 0-byte buffer that points at libarrow's static area for 0-byte allocations, and
``Array.validate(full=True)`` accepts it (a 0-length array may have an empty offsets buffer). Some
kernels do not check and read ``offsets[0]`` anyway: ``RecordBatch.nbytes`` (the sort's memory
account) takes the static area's filler as an offset (-189,153,672 as an int32) and reads a child
756 MB away, a segmentation fault of the Python worker (the documented copy, ``read ->
repartition(n, "subject") -> write``, crashed so on every run with PySpark 4.0.5).

The batches themselves are sound otherwise, and the sink may keep them as long as it likes: PySpark
reads the JVM's stream with ``pyarrow.ipc.open_stream`` over the worker's socket file, and each
buffer is a slice of a ``bytes`` object that file returned, owned by the buffer (docs/architecture.md,
"What Spark's batches may outlive").

:func:`sound` gives each batch back as it is unless some array in it is empty with short offsets;
then only those arrays are replaced by proper empty ones (no row is copied). The check is a walk
over the column tree, a few microseconds per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def sound(batches: Iterable[Any]) -> Iterator[Any]:
    """``batches`` with every array that pyarrow could misread repaired (:func:`repaired`)."""
    for batch in batches:
        yield repaired(batch)


def repaired(batch: Any) -> Any:
    """``batch`` itself when every array in it has the offsets its length needs; else a batch with
    those arrays rebuilt (module docstring)."""
    import pyarrow as pa

    old = batch.columns
    columns = [_repaired(column) for column in old]
    if all(new is was for new, was in zip(columns, old, strict=True)):
        return batch
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _offset_width(arrow_type: Any) -> int:
    """Bytes per offset of a type that has an offsets buffer (its buffer 1), or 0."""
    import pyarrow as pa

    t = pa.types
    if t.is_string(arrow_type) or t.is_binary(arrow_type) or t.is_list(arrow_type) or t.is_map(arrow_type):
        return 4
    if t.is_large_string(arrow_type) or t.is_large_binary(arrow_type) or t.is_large_list(arrow_type):
        return 8
    return 0


def _short_offsets(array: Any, width: int) -> bool:
    offsets = array.buffers()[1]
    return offsets is None or offsets.size < (array.offset + len(array) + 1) * width


def _repaired(array: Any) -> Any:
    import pyarrow as pa

    arrow_type = array.type
    width = _offset_width(arrow_type)
    if width and len(array) == 0 and _short_offsets(array, width):
        return pa.array([], type=arrow_type)  # what arrow-java 18 meant: no values, offsets [0]
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_map(arrow_type):
        values = array.values  # the whole child (a map's: its key/item entries), as the offsets index it
        fixed = _repaired(values)
        if fixed is values:
            return array
        return pa.Array.from_buffers(arrow_type, len(array), array.buffers()[:2], array.null_count, array.offset,
                                     children=[fixed])
    if pa.types.is_struct(arrow_type):
        children = [array.field(i) for i in range(arrow_type.num_fields)]  # sliced as the struct is
        fixed = [_repaired(child) for child in children]
        if all(new is old for new, old in zip(fixed, children, strict=True)):
            return array
        return pa.StructArray.from_arrays(fixed, fields=list(arrow_type),
                                          mask=array.is_null() if array.null_count else None)
    return array

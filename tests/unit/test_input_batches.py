"""Batches shaped as PySpark 4.0/4.1 send them (arrow-java 18: empty arrays with a 0-byte offsets
buffer) are repaired before the sink touches them (sink/order/input_batches.py, issue #39).

The calls that crashed run in a child interpreter: a segmentation fault there fails the test
instead of ending the test run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pyarrow as pa

from pyspark_jetstream.sink.order.input_batches import repaired

HEADERS = pa.map_(pa.string(), pa.list_(pa.string()))


def arrow_java_18_batch() -> pa.RecordBatch:
    """Two rows without headers, as the JVM of PySpark 4.0.5 writes them and pyarrow reads them back:
    the map's keys, value lists and their strings are empty with 0-byte offsets buffers."""
    empty = pa.allocate_buffer(0)
    strings = pa.Array.from_buffers(pa.string(), 0, [None, empty, empty])
    lists = pa.Array.from_buffers(pa.list_(pa.string()), 0, [None, empty], children=[strings])
    entries = pa.StructArray.from_arrays([strings, lists], fields=[HEADERS.key_field, HEADERS.item_field])
    headers = pa.Array.from_buffers(HEADERS, 2, [pa.py_buffer(b"\x00"), pa.py_buffer(bytes(12))], null_count=2,
                                    children=[entries])
    batch = pa.record_batch([pa.array(["a", "b"]), headers, pa.array([2, 1], pa.int64())],
                            names=["subject", "headers", "seq"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()  # as PySpark's ArrowStreamSerializer does


def test_the_shape_is_the_one_spark_4_0_sends():
    batch = arrow_java_18_batch()
    keys_offsets = batch.column("headers").values.field(0).buffers()[1]
    assert keys_offsets.size == 0
    batch.validate(full=True)  # pyarrow accepts it: a 0-length array may have an empty offsets buffer


def test_a_sound_batch_is_given_back_as_it_is():
    batch = pa.record_batch([pa.array(["a"]), pa.array([[("k", ["v"])]], HEADERS), pa.array([1], pa.int64())],
                            names=["subject", "headers", "seq"])
    assert repaired(batch) is batch


def test_the_repaired_batch_holds_the_same_rows_and_offsets_everywhere():
    batch = repaired(arrow_java_18_batch())
    batch.validate(full=True)
    assert batch.to_pylist() == [{"subject": "a", "headers": None, "seq": 2}, {"subject": "b", "headers": None, "seq": 1}]
    headers = batch.column("headers")
    for child in (headers.values.field(0), headers.values.field(1), headers.values.field(1).values):
        assert child.buffers()[1].size >= 4


CHILD = """
import sys
sys.path[:0] = {paths!r}
from tests.unit.test_input_batches import arrow_java_18_batch
from pyspark_jetstream.sink.order.input_batches import repaired
from pyspark_jetstream.sink.order.sorted_rows import SortedRows
batch = repaired(arrow_java_18_batch())
print(batch.nbytes)
rows = SortedRows("seq", 1 << 20)
rows.hold(batch)
rows.hold(batch)
print([r["seq"] for b in rows.batches(10) for r in b.to_pylist()])
"""


def test_the_calls_that_crashed_on_spark_4_0_run_on_the_repaired_batch():
    """``RecordBatch.nbytes`` (the sort's account) read ``offsets[0]`` of the empty children and crashed
    the worker; the sort's concatenation and take read them too."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent(CHILD.format(paths=[root, os.path.join(root, "connector")]))
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.splitlines()[-1] == "[1, 1, 2, 2]"

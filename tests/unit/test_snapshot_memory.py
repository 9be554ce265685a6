"""What an open snapshot (a batch ``kv.view=latest`` read) keeps per key it delivered (issue #33, item 7):
``PartitionReader.taken``, the subjects already read, so that a change delivered after the consumer's set,
or the set delivered again by a recreated consumer, is not read twice. It grows with the keys of the
partition, not with their changes; docs/source.md states the measured size."""

from __future__ import annotations

import queue
import sys

from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source.read.partition_reader import PartitionReader

KEYS = 1_000_000
BYTES_PER_KEY = 120
"""The bound docs/source.md states for a key of about 20 bytes (``$KV.CONFIG.key-0000001``)."""


def test_an_open_snapshot_remembers_each_key_it_read_in_about_a_hundred_bytes():
    opts = parse_source_options({"servers": "nats://127.0.0.1:4222", "bucket": "CONFIG", "batchSize": "10000"},
                                streaming=False)
    out: queue.Queue = queue.Queue()
    reader = PartitionReader(opts, "KV_CONFIG", 1, None, out, last_per_subject=True, filters=("$KV.CONFIG.>",))
    for i in range(KEYS):
        subject = b"$KV.CONFIG.key-%07d" % i  # a frame's subject is its own bytes object, as here
        reader._on_snapshot_message(subject, b"$JS.ACK.x", b"v", None, i + 1, 0, KEYS - i, 1, 0.0)
        if i % 10_000 == 9_999:
            while not out.empty():  # Spark's thread takes the batches
                out.get_nowait()
                reader.ahead -= 1
    # Each change of a key already read is skipped, and adds nothing.
    for i in range(0, KEYS, 10):
        reader._on_snapshot_message(b"$KV.CONFIG.key-%07d" % i, b"$JS.ACK.x", b"w", None, KEYS + i + 1, 0, 1, 1, 0.0)
    taken = reader.taken
    assert len(taken) == KEYS
    size = sys.getsizeof(taken) + sum(map(sys.getsizeof, taken))
    print(f"taken: {size / 1e6:.0f} MB for {KEYS} keys of {len(b'$KV.CONFIG.key-0000001')} bytes, "
          f"{size / KEYS:.0f} bytes per key")
    assert size <= BYTES_PER_KEY * KEYS

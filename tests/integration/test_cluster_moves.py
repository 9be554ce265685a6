"""A task killed in the middle of a move, on a real 3-node cluster: its retry loses nothing (issue #47, part 1).

A write task publishes to an R3 stream while the stream's leader steps down again and again, until its ordered
repair moves rows (stored ahead of one whose frame the old leader lost). The task dies at the move: before its
moved copies go out, or once they are stored and before the old copies are deleted. Its retry (a retried attempt
without replay records: its PubAcks tell what is stored, within the duplicate window) must end with every row
stored once, each subject in the task's order. Before, a move deleted the old copies first: a task dying there
left rows with no copy, which the retry counted as stored.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from pyspark_jetstream.sink.encode.msg_ids import move_base
from pyspark_jetstream.sink.publish.moves import Mover
from pyspark_jetstream.sink.publish.recovery import OrderedRecovery
from pyspark_jetstream.sink.task import write as write_module

from ..helpers import SyncNats

ROWS, SUBJECTS, STREAM = 60_000, 4, "MOVEKILL"


class TaskKilled(RuntimeError):
    """Stands for the executor dying: the task's publisher stops where it is."""


def _batches():
    import pyarrow as pa

    for start in range(0, ROWS, 5_000):
        ids = range(start, min(ROWS, start + 5_000))
        yield pa.RecordBatch.from_pydict({"subject": [f"{STREAM}.s{i % SUBJECTS}" for i in ids],
                                          "data": [str(i).encode() for i in ids],
                                          "stream": ["SRC"] * len(ids), "seq": [i + 1 for i in ids]})


def _kill_at(monkeypatch, point: str, killed: threading.Event) -> None:
    """Make the first move raise at ``point``: 'before-send' (its frames renamed, nothing sent, nothing deleted) or
    'before-delete' (its new copies acknowledged, the old ones still stored)."""
    if point == "before-send":
        move = OrderedRecovery._move

        async def killing_move(self, frames, delete_first=False):
            again, first_sends = await move(self, frames, delete_first)
            if again and not delete_first:
                killed.set()
                raise TaskKilled("killed before the moved copies went out")
            return again, first_sends

        monkeypatch.setattr(OrderedRecovery, "_move", killing_move)
    else:
        delete = Mover.delete_replaced

        async def killing_delete(self, inflight, refused_positions):
            if any(token not in inflight for token in self.replaced):
                killed.set()
                raise TaskKilled("killed before the old copies were deleted")
            await delete(self, inflight, refused_positions)

        monkeypatch.setattr(Mover, "delete_replaced", killing_delete)


def _first_attempt_killed(client: SyncNats, plan, killed: threading.Event) -> bool:
    """Write the task's rows while the stream's leader steps down every 0.3 s: whether the task was killed at a
    move (else it ended, every row stored)."""
    from .test_cluster import _step_down

    stop = threading.Event()

    def step_downs():  # until the repair has moved rows (and the task died there), or the write ended
        deadline = time.monotonic() + 240
        while not killed.is_set() and not stop.wait(0.3) and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a request lost mid-election: the next one goes
                _step_down(client, STREAM)

    thread = threading.Thread(target=step_downs, daemon=True)
    thread.start()
    try:
        write_module.write_partition(plan, _batches())
    except TaskKilled:
        raise AssertionError("the kill must fail the task through its publisher") from None
    except Exception as exc:
        if not killed.is_set():  # failed otherwise mid-election (an ackTimeout): the next try
            print(f"the write failed before any move: {exc!r}")
        return killed.is_set()
    finally:
        stop.set()
        thread.join(60)
    return False


@pytest.mark.parametrize("point", ["before-send", "before-delete"])
def test_a_task_killed_at_a_move_is_retried_with_every_row_once_in_order(nats_cluster, monkeypatch, point):
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    from pyspark_jetstream.sink.plan.sink_plan import plan_sink

    client = SyncNats(nats_cluster.url)
    try:
        client.api(f"STREAM.DELETE.{STREAM}")
        client.add_stream(STREAM, [f"{STREAM}.>"], storage="file", num_replicas=3)  # the plan checks it exists
        schema = StructType([StructField("subject", StringType()), StructField("data", BinaryType()),
                             StructField("stream", StringType()), StructField("seq", LongType())])
        plan = plan_sink({"servers": nats_cluster.url, "stream": STREAM, "sinkState": "none"}, schema,
                         overwrite=False, streaming=False)
        killed = threading.Event()
        _kill_at(monkeypatch, point, killed)
        for _ in range(10):  # a step-down makes the repair move rows only when it lands mid-write: a few tries
            client.api(f"STREAM.DELETE.{STREAM}")
            client.add_stream(STREAM, [f"{STREAM}.>"], storage="file", num_replicas=3)
            if _first_attempt_killed(client, plan, killed):
                break
        assert killed.is_set(), "no move was made in ten writes"
        monkeypatch.undo()

        # Spark's retry of the task: attempt 1, its moved ids numbered apart from its predecessor's.
        monkeypatch.setattr(write_module, "retried_attempt", lambda: (move_base("retry"), True))
        message = write_module.write_partition(plan, _batches())
        by_subject: dict[str, list[int]] = {}
        for subject, data in client.subjects_and_data(STREAM):
            by_subject.setdefault(subject, []).append(int(data))
        for subject, values in by_subject.items():
            assert values == sorted(values), f"{subject}: {sum(b < a for a, b in zip(values, values[1:], strict=False))} out of order"
        assert sorted(v for vs in by_subject.values() for v in vs) == list(range(ROWS))  # each once
        print(f"{point}: retry published {message.published}, duplicates {message.duplicates}, "
              f"moved {message.reordered}")
    finally:
        client.api(f"STREAM.DELETE.{STREAM}")
        client.close()

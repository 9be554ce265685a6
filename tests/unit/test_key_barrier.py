"""The key barrier of a bucket write (sink/task/key_barrier.py, issue #54): where a task drains so that
a row expecting its key's last revision is checked after the key's earlier rows, as nats-py's KeyValue
calls one at a time are."""

from __future__ import annotations

from pyspark_jetstream.protocol.frames import hpub_frame
from pyspark_jetstream.sink.task.key_barrier import KeyBarrier, is_checked


def _frame(position: int, key: str, expected: int | None = None, payload: bytes = b"v") -> tuple:
    block = f"NATS/1.0\r\nNats-Msg-Id: m{position}\r\n"
    if expected is not None:
        block += f"Nats-Expected-Last-Subject-Sequence: {expected}\r\n"
    block = (block + "\r\n").encode()
    subject = f"$KV.B.{key}"
    frame = hpub_frame(subject, f"_INBOX.x.{position}", block, payload)
    return (position, frame, subject, None, f"m{position}", len(block), len(payload))


def _cuts(barrier: KeyBarrier, frames: list) -> list[list[int]]:
    return [[f[0] for f in run] for run in barrier.runs(frames)]


def test_the_header_is_looked_for_in_the_header_block_only():
    assert is_checked(_frame(0, "a", 0))
    assert not is_checked(_frame(0, "a"))
    assert not is_checked(_frame(0, "a", payload=b"\r\nNats-Expected-Last-Subject-Sequence: 3\r\n"))


def test_plain_rows_and_checked_rows_of_new_keys_never_wait():
    frames = [_frame(0, "a"), _frame(1, "b", 0), _frame(2, "a"), _frame(3, "c", 5), _frame(4, "d")]
    assert _cuts(KeyBarrier(), frames) == [[0, 1, 2, 3, 4]]


def test_a_checked_row_of_a_key_sent_since_the_last_drain_goes_alone_after_a_drain():
    frames = [_frame(0, "a"), _frame(1, "a", 0), _frame(2, "b"), _frame(3, "a")]
    assert _cuts(KeyBarrier(), frames) == [[0], [1], [2, 3]]


def test_a_row_after_a_checked_row_of_its_key_waits_for_a_drain():
    frames = [_frame(0, "a", 0), _frame(1, "b"), _frame(2, "a"), _frame(3, "b", 0), _frame(4, "a", 9)]
    # b's row 1 was drained with a's: b's checked row 3 needs no drain; a's checked row 4 does, and goes alone.
    assert _cuts(KeyBarrier(), frames) == [[0, 1], [2, 3], [4], []]


def test_the_keys_are_remembered_across_calls_until_a_drain():
    barrier = KeyBarrier()
    assert _cuts(barrier, [_frame(0, "a")]) == [[0]]
    assert _cuts(barrier, [_frame(1, "a", 0)]) == [[], [1], []]
    barrier.drained()
    assert _cuts(barrier, [_frame(2, "b"), _frame(3, "a", 4)]) == [[2, 3]]


def test_memory_is_bounded_by_draining_past_max_keys():
    barrier = KeyBarrier(max_keys=3)
    frames = [_frame(p, f"k{p}") for p in range(7)]
    assert _cuts(barrier, frames) == [[0, 1, 2], [3, 4, 5], [6]]

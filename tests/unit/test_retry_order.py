"""A retry finishing the order its failed attempt left broken (sink/publish/retry_order.py), as plain values."""

from __future__ import annotations

import random

from pyspark_jetstream.sink.publish.retry_order import Place, RetryOrder


def test_rows_stored_past_a_missing_one_move_behind_it():
    # row id -> sequences: r3 of subject a is missing, r4 and r5 of a were stored after r2; b is whole
    copies = {"r0": (1,), "r1": (2,), "r2": (3,), "r4": (5,), "r5": (6,), "b0": (4,), "b1": (7,)}
    order = RetryOrder(copies)
    walk = [order.place(s, r) for s, r in [("a", "r0"), ("a", "r1"), ("b", "b0"), ("a", "r2"), ("a", "r3"),
                                            ("a", "r4"), ("b", "b1"), ("a", "r5")]]
    assert walk == [Place(False), Place(False), Place(False), Place(False), Place(True), Place(True, (5,)),
                    Place(False), Place(True, (6,))]
    assert not walk[4].moved and walk[5].moved


def test_a_repair_cut_short_is_finished():
    # the publisher had moved r1 behind r2 (a new copy at 9) and died before moving r2: r2 stays ahead
    order = RetryOrder({"r0": (1,), "r1": (9,), "r2": (3,)})
    assert [order.place("a", r) for r in ("r0", "r1", "r2")] == [Place(False), Place(False), Place(True, (3,))]


def test_a_row_stored_twice_keeps_the_copy_in_place_and_loses_the_other():
    # a retry died after storing its moved copy of r1 (at 8) and before deleting the old one (at 2)
    order = RetryOrder({"r0": (1,), "r1": (2, 8), "r2": (9,)})
    order_after_hole = RetryOrder({"r0": (1,), "r9": (5,), "r1": (2, 8)})
    assert [order.place("a", r) for r in ("r0", "r1", "r2")] == [Place(False), Place(False, (8,)), Place(False)]
    # r9 (in place at 5) comes first in the task: r1's copy at 8 is the one in order
    assert [order_after_hole.place("a", r) for r in ("r0", "r9", "r1")] == [Place(False), Place(False),
                                                                            Place(False, (2,))]


def test_after_the_walk_every_subject_is_in_the_task_order_once():
    rng = random.Random(39)
    for _ in range(500):
        rows = [(rng.choice("ab"), f"r{p}") for p in range(rng.randint(1, 30))]
        stream: list[tuple[int, str]] = []  # (seq, row) as an attempt that died left them: holes, shuffled, twice
        seq = 0
        for _, row in rng.sample(rows, len(rows)):
            for _ in range(rng.choice((0, 1, 1, 1, 2))):
                seq += 1
                stream.append((seq, row))
        copies: dict[str, tuple[int, ...]] = {}
        for s, row in stream:
            copies[row] = copies.get(row, ()) + (s,)
        order = RetryOrder(copies)
        deleted: set[int] = set()
        for subject, row in rows:
            place = order.place(subject, row)
            deleted.update(place.stale)
            if place.publish:
                seq += 1
                stream.append((seq, row))
        subject_of = dict((r, s) for s, r in rows)
        for subject in "ab":
            got = [row for s, row in stream if s not in deleted and subject_of[row] == subject]
            assert got == [row for s, row in rows if s == subject], (rows, copies)


def test_a_retried_attempt_numbers_its_moved_copies_apart():
    from pyspark_jetstream.protocol.frames import hpub_frame
    from pyspark_jetstream.sink.publish.moves import Mover
    from pyspark_jetstream.sink.publish.publisher import Publisher

    block = b"NATS/1.0\r\nNats-Msg-Id: run:0:5\r\n\r\n"
    frame = (5, hpub_frame("T.s1", "_INBOX.x.5", block, b"p"), "T.s1", None, "run:0:5", len(block), 1)
    publisher = Publisher.__new__(Publisher)
    publisher.reply_prefix, publisher.mover = "_INBOX.x.", Mover(None, "T", "$JS.API", False, 5.0, move_base=7000)
    assert publisher.moved_copy(frame)[4] == "run:0:5:o7000"  # the retry's own move
    assert publisher.mover.renamed(frame, "_INBOX.x.", 2)[4] == "run:0:5:o7002"  # a leader-change round (2) of it


def test_a_replays_frames_are_walked_in_order_moved_behind_the_missing_row_and_their_old_copies_deleted_after():
    """RetryMoves (the retry-order state of a task): r1 is missing; r2, stored past it, moves under the attempt's
    own id and its old copy is to be deleted, unless the server refused the moved copy."""
    from pyspark_jetstream.sink.publish.retry_order import RetryMoves

    class Pub:
        def moved_copy(self, f):
            return (f[0], f[1], f[2], f[3], f"{f[4]}:o1", f[5], f[6])

    def frame(position, msg_id):
        return (position, b"", "a", None, msg_id, 0, 0)

    moves = RetryMoves({"r0": (1,), "r2": (3,)}, deny_delete=False, attempt_id="t/1", bucket=False)
    out = moves.in_order_behind([frame(0, "r0"), frame(1, "r1"), frame(2, "r2")], {"r0": (1,), "r2": (3,)}, None,
                                Pub())
    assert [f[4] for f in out] == ["r1", "r2:o1"] and (moves.already_stored, moves.moved) == (1, 1)
    assert moves.move_base % 1000 == 0 and moves.move_base > 0
    assert moves.stale == [(2, (3,))]
    # The server refused the moved copy of r2 (position 2) and the row r1 (position 1): r2's old copy stays and
    # stands for it (issue #54: no dead letter, no failure; counted as left in place), r1 stays a refusal.
    assert moves.keep_refused({1, 2}) == {2}
    assert (moves.moved, moves.left_in_place) == (0, 1)
    assert moves.take_stale() == [] and moves.stale == []
    again = RetryMoves({"r0": (1,), "r2": (3,)}, deny_delete=False, attempt_id="t/1", bucket=False)
    again.in_order_behind([frame(0, "r0"), frame(1, "r1"), frame(2, "r2")], {}, None, Pub())
    assert again.take_stale() == [3]

    denied = RetryMoves({"r0": (1,), "r2": (3,)}, deny_delete=True, attempt_id="t/1", bucket=False)
    out = denied.in_order_behind([frame(0, "r0"), frame(1, "r1"), frame(2, "r2")], {}, None, Pub())
    assert [f[4] for f in out] == ["r1"] and denied.left_in_place == 1 and denied.take_stale() == []

"""Putting a subject's messages back in order after a leader change (sink/publish/reorder.py), as plain values."""

from __future__ import annotations

import random

from pyspark_jetstream.protocol.frames import hpub_frame, parse_hpub_frame
from pyspark_jetstream.sink.encode.msg_ids import base_id, moved_id
from pyspark_jetstream.sink.publish.moves import Mover
from pyspark_jetstream.sink.publish.reorder import Stored, ahead


def _stored(rows):
    return [Stored(str(p), p, s, q) for p, s, q in rows]


def test_frames_stored_before_an_earlier_one_of_their_subject_are_ahead():
    # position, subject, stream sequence: b's 3 and 4 were stored before its 2 (sent again later)
    rows = [(0, "a", 1), (1, "b", 2), (2, "a", 3), (3, "b", 10), (4, "b", 4), (5, "b", 5), (6, "a", 6), (7, "b", 11)]
    assert [f.position for f in ahead(_stored(rows))] == [4, 5, 7]  # 7 is after 10, but must follow 4 and 5
    assert ahead(_stored([(0, "a", 5), (1, "a", 6), (2, "b", 1)])) == []  # other subjects do not count


def test_moving_the_frames_ahead_puts_every_subject_in_order():
    rng = random.Random(4)
    for _ in range(300):
        subjects = "abc"[: rng.randint(1, 3)]
        rows = [(p, rng.choice(subjects), rng.sample(range(1, 10_000), 1)[0]) for p in range(rng.randint(1, 40))]
        moved = {f.position for f in ahead(_stored(rows))}
        top = max(q for _, _, q in rows)
        # the moved ones get new sequences after everything, in the task's order
        renumbered = {p: top + 1 + k for k, p in enumerate(sorted(moved))}
        after = {p: renumbered.get(p, q) for p, _, q in rows}
        for subject in subjects:
            seqs = [after[p] for p, s, _ in sorted(rows) if s == subject]
            assert seqs == sorted(seqs), (rows, moved)


def test_a_moved_message_carries_its_rows_id_with_a_suffix_the_replay_records_read_back():
    assert moved_id("q:7:S.5:abc", 1) == "q:7:S.5:abc:o1"
    assert moved_id("q:7:S.5:abc:o1", 2) == "q:7:S.5:abc:o2"
    assert base_id("q:7:S.5:abc:o12") == base_id("q:7:S.5:abc") == "q:7:S.5:abc"
    assert base_id("w:0:15") == "w:0:15"


def test_the_publisher_renames_a_frame_and_keeps_everything_else():
    block = b"NATS/1.0\r\nNats-Msg-Id: run:S.5:abc\r\nNats-TTL: 1h\r\nNats-Expected-Stream: T\r\n\r\n"
    frame = hpub_frame("T.s1", "_INBOX.x.5", block, b"payload")
    mover = Mover(None, "T", "$JS.API", False, 5.0)
    renamed = mover.renamed((5, frame, "T.s1", "1h", "run:S.5:abc", len(block), 7), "_INBOX.x.", 3)  # round 3
    subject, new_block, payload = parse_hpub_frame(renamed[1])
    assert (subject, payload, renamed[4]) == ("T.s1", b"payload", "run:S.5:abc:o3")
    assert new_block == block.replace(b"run:S.5:abc", b"run:S.5:abc:o3") and renamed[5] == len(new_block)
    assert renamed[1].startswith(b"HPUB T.s1 _INBOX.x.5 ")


def test_a_compare_and_set_row_is_recognised_under_a_moved_copys_id():
    """Issue #39, item 5: cas_replay reads a stored id as the row's own whatever round moved it."""
    from pyspark_jetstream.sink.records.cas_replay import same_row

    assert same_row("q:0:5:o2", "q:0:5") and same_row("q:0:5", "q:0:5:o1") and same_row("q:0:5:o1", "q:0:5:o3")
    assert not same_row("q:0:50", "q:0:5") and not same_row("q:0:5:o1", "q:0:50") and not same_row(None, "q:0:5")


def test_a_compare_and_set_frame_goes_out_first_of_its_subject_with_what_is_stored_after_it_moved():
    """Issue #39, item 4 (reorder.in_place): unanswered frames (position, subject, conditional) and stored ones."""
    from pyspark_jetstream.sink.publish.reorder import Unanswered, in_place

    unanswered = [Unanswered(str(p), p, s, c) for p, s, c in
                  [(0, "k", True), (3, "k", False), (4, "k", True), (5, "k", False), (1, "j", False), (6, "j", True)]]
    stored = _stored([(2, "k", 10), (7, "k", 11), (8, "j", 12)])
    send, move = in_place(unanswered, stored)
    # k: the create at 0 goes with 3; the frame at 4 waits (3 is not in place yet), and 5 behind it; k's stored
    # frames after 0 move first. j: its first unanswered frame is unconditional: as before, nothing moves first.
    assert sorted(send, key=int) == ["0", "1", "3"]
    assert [f.position for f in move] == [2, 7]
    assert in_place([Unanswered("0", 0, "k", False)], stored) == (["0"], [])

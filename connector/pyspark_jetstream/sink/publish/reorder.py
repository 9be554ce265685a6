"""Putting a subject's messages back in order after a stream leader change, free of I/O.

**Why.** The publisher keeps thousands of frames in flight. When a clustered stream's leader
steps down or dies, the frames that reach it in the meantime are dropped (or answered 503),
while the frames after them reach the new leader and are stored: one subject's later
messages are then in the stream before its earlier ones, and sending the lost ones again
(with their ids, so nothing is stored twice) stores them after. Nothing the server offers
fences a pipelined publish per subject without knowing each message's sequence in advance, so
the publisher repairs instead: it stops sending when it sees the trouble (a 503, a PubAck that
overtakes an older frame, silence, a reconnect), waits until every frame in flight is answered
or quiet, and then, for each subject with an unanswered frame, deletes the messages of that
subject stored after it (by the sequence their PubAcks gave) and sends everything again in
the task's order, the moved messages under a new ``Nats-Msg-Id`` (the old one with
``:o<round>`` appended: the server still remembers the old id after the delete, and the replay
records read the suffix as the same row, :func:`~pyspark_jetstream.sink.encode.msg_ids.base_id`). Then it checks, from the sequences
the PubAcks gave (a duplicate's PubAck names the original's), that each subject's frames are
stored in the task's order, and moves again any that are not (:func:`ahead`), until none is
unanswered and none is out of order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stored:
    """A frame the stream holds: where it stands in the task, its subject and its stream sequence (from
    its PubAck, or from the PubAck of a copy the server took for a duplicate)."""

    token: str
    position: int
    subject: str
    seq: int


def ahead(stored: Iterable[Stored]) -> list[Stored]:
    """The frames to move so that each subject's frames are stored in the task's order: walking a
    subject's frames in the task's order, the first one whose sequence is below that of a frame before
    it, and every frame of the subject after it. Published again (after their copies are deleted, while
    nothing new is sent), they land after everything the stream holds, in the task's order, behind
    the subject's frames that stay."""
    by_subject: dict[str, list[Stored]] = {}
    for s in stored:
        by_subject.setdefault(s.subject, []).append(s)
    out = []
    for frames in by_subject.values():
        frames.sort(key=lambda f: f.position)
        top = 0
        for i, f in enumerate(frames):
            if f.seq < top:
                out.extend(frames[i:])
                break
            top = f.seq
    return sorted(out, key=lambda f: f.position)


@dataclass(frozen=True)
class Unanswered:
    """A frame to send again: its place in the task, its subject, and whether it expects its subject's last
    sequence (``Nats-Expected-Last-Subject-Sequence``: a KV create or ``expected_revision``, ``sequenceBy``)."""

    token: str
    position: int
    subject: str
    conditional: bool


def in_place(unanswered: Iterable[Unanswered], stored: Iterable[Stored]) -> tuple[list[str], list[Stored]]:
    """(the frames to send again now, the stored frames to move first). A frame that expects its subject's last
    sequence holds only in the task's order: sent again behind frames of its subject stored ahead of it, it
    would be refused (wrong last sequence) although it succeeds in the task's order. So it goes out only as
    the first unanswered frame of its subject (later ones of the subject wait for the next round), and the
    frames of its subject stored after it in the task are moved first (deleted, and sent again behind it in
    the same batch). Unconditional frames go out as before; what lands ahead of them is moved afterwards
    (:func:`ahead`)."""
    by_subject: dict[str, list[Unanswered]] = {}
    for u in sorted(unanswered, key=lambda u: u.position):
        by_subject.setdefault(u.subject, []).append(u)
    later: dict[str, list[Stored]] = {}
    for s in stored:
        later.setdefault(s.subject, []).append(s)
    send: list[str] = []
    move: list[Stored] = []
    for subject, frames in by_subject.items():
        for i, f in enumerate(frames):
            if f.conditional and i > 0:
                break  # an earlier frame of its subject is not in place yet: the next round sends it
            send.append(f.token)
        if frames[0].conditional:
            move.extend(s for s in later.get(subject, ()) if s.position > frames[0].position)
    return send, sorted(move, key=lambda f: f.position)

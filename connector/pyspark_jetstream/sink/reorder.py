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
records read the suffix as the same row, :func:`base_id`). Then it checks, from the sequences
the PubAcks gave (a duplicate's PubAck names the original's), that each subject's frames are
stored in the task's order, and moves again any that are not (:func:`ahead`), until none is
unanswered and none is out of order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_MOVED = re.compile(r":o\d+$")


def moved_id(msg_id: str, round_: int) -> str:
    """The id a message sent again after its stored copy was deleted carries."""
    return f"{base_id(msg_id)}:o{round_}"


def base_id(msg_id: str) -> str:
    """The row's own id, whatever round of reordering stored it."""
    return _MOVED.sub("", msg_id)


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

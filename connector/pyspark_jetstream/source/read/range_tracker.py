"""Where one partition stands in its sequence range: the rules that end or restart it, free of I/O.

The partition reader feeds it every delivered message's stream sequence,
consumer sequence and pending count (from the ack subject) and carries out
the :class:`Step` it answers; the ADR-37 pull bookkeeping is the
:class:`~pyspark_jetstream.protocol.pull_engine.PullEngine`'s. The rules:

- a consumer sequence that is not the last one + 1 means deliveries were lost
  (during a reconnect, say): recreate the consumer from the last stream
  sequence taken + 1, as nats.go's ordered consumer does;
- a stream sequence past the range's last ends the partition without taking it;
- a stream sequence already taken is skipped (a recreated last-per-subject
  consumer delivers its set from the start again);
- the range's last sequence ends it after taking it;
- ``pending == 0`` before the range's end: nothing more to deliver (the tail
  was deleted or filtered out; in a cluster the reader confirms it first);
- no progress for ``max_wait`` seconds is a stall;
- a new consumer the server started past the requested sequence skipped
  messages: :meth:`lost_range` names them.
"""

from __future__ import annotations

import enum


class Step(enum.Enum):
    GAP = "gap"  # deliveries were lost: recreate the consumer from next_seq
    PAST_END = "past end"  # the message is past the range: finish without it
    TAKE = "take"  # take it and keep pulling
    TAKE_LAST = "take last"  # take it: the range is complete
    TAKE_DRAINED = "take drained"  # take it; the consumer has nothing more pending before the range's end
    TAKEN_BEFORE = "taken before"  # skip it: taken from an earlier consumer (a snapshot's set delivered again)


_GAP, _PAST_END, _TAKE, _TAKE_LAST, _TAKE_DRAINED, _TAKEN_BEFORE = (
    Step.GAP, Step.PAST_END, Step.TAKE, Step.TAKE_LAST, Step.TAKE_DRAINED, Step.TAKEN_BEFORE)


class RangeTracker:
    """One partition's progress through ``first..last`` (both included)."""

    def __init__(self, first: int, last: int, now: float) -> None:
        self.first = first
        self.last = last
        self.last_sseq = first - 1  # the last stream sequence taken (or skipped as lost)
        self.last_dseq = 0  # the last consumer sequence of the current consumer
        self.last_progress = now

    @property
    def next_seq(self) -> int:
        """Where a new consumer starts."""
        return self.last_sseq + 1

    @property
    def complete(self) -> bool:
        return self.last_sseq >= self.last

    def consumer_created(self) -> None:
        """A new consumer numbers its deliveries from 1."""
        self.last_dseq = 0

    def on_message(self, sseq: int, dseq: int, pending: int, now: float) -> tuple[Step, int]:
        """The step for a delivered message, and by how many stream sequences it advanced the range.
        Called once per message: the steps are module-level names (an enum member lookup per call
        costs more than the rest of the rules)."""
        if dseq != self.last_dseq + 1:
            return _GAP, 0
        self.last_dseq = dseq
        last_sseq = self.last_sseq
        if sseq > self.last:
            return _PAST_END, 0
        if sseq <= last_sseq:
            return _TAKEN_BEFORE, 0
        self.last_sseq = sseq
        self.last_progress = now
        if sseq >= self.last:
            return _TAKE_LAST, sseq - last_sseq
        if pending == 0:
            return _TAKE_DRAINED, sseq - last_sseq
        return _TAKE, sseq - last_sseq

    def take_run(self, first: tuple[int, int], last: tuple[int, int], count: int, drained: bool,
                 now: float) -> int | None:
        """Take ``count`` deliveries at once, given the ``(stream, consumer)`` sequences of the first and
        the last, when :meth:`on_message` would answer TAKE for every one of them; how far they advanced
        the range, or None (nothing changed: each goes through :meth:`on_message`).

        That holds when the consumer sequences run on without a gap (the server numbers a consumer's
        deliveries one by one, so the first being the next and the last ``count - 1`` after it leaves no
        room for one), the first stream sequence is past the last taken and the last is before the
        range's last (a consumer delivers in stream order), and no delivery said ``pending == 0``."""
        (first_sseq, first_dseq), (last_sseq, last_dseq) = first, last
        if (drained or count < 2 or first_dseq != self.last_dseq + 1 or last_dseq != first_dseq + count - 1
                or first_sseq <= self.last_sseq or last_sseq >= self.last or last_sseq < first_sseq + count - 1):
            return None
        advance = last_sseq - self.last_sseq
        self.last_dseq, self.last_sseq, self.last_progress = last_dseq, last_sseq, now
        return advance

    def lost_range(self, start_seq: int, delivered_stream_seq: int | None) -> tuple[int, int, int] | None:
        """``(first, last, moved_to)``: the sequences of this range that a consumer asked to start at
        ``start_seq`` skipped, and where it starts instead; None when it starts where asked.

        The server starts a consumer asked to begin below the stream's first sequence
        at the first sequence, without a word: ``delivered.stream_seq`` is then one
        below where it starts. Filtered-out sequences never move the start.
        """
        moved_to = (start_seq - 1 if delivered_stream_seq is None else delivered_stream_seq) + 1
        if moved_to <= start_seq:
            return None
        return start_seq, min(moved_to - 1, self.last), moved_to

    def skip_to(self, seq: int) -> int:
        """Go on after ``seq`` (lost sequences, ``failOnDataLoss=false``); how many were skipped."""
        skipped = max(seq - self.last_sseq, 0)
        self.last_sseq = max(self.last_sseq, seq)
        return skipped

    def touch(self, now: float) -> None:
        """Progress of another kind (a reconnect): the stall clock starts over."""
        self.last_progress = now

    def stalled(self, now: float, max_wait: float) -> bool:
        return now - self.last_progress > max_wait

"""A retried attempt finishes the order its predecessor left broken (the walk free of I/O).

**Why.** An attempt that dies with a hole in a subject (a row unstored: its frame lost with a
leader, or refused, while the rows of its subject behind it were stored; or a repair of the
publisher cut short, :mod:`.reorder`) leaves its retry (or a replay) a target where the subject's
later rows stand ahead of the row still missing. Skipping what is stored and publishing the rest
would store the missing row behind them, silently out of order (issue #39).

**How.** The replay scan gives, for each of the run's ids it found, the sequences of its copies
(``replay_guard.stored_ids``). The task walks its frames in its publishing order (the order the
first attempt sent them in) and keeps, per subject, the sequence of the last row left in place. A
row with a copy after that sequence stays where it is (skipped, as before; any other copy of it is
deleted: a copy stored twice). The first row of a subject with no copy there (missing, or only
stored before a row left in place) *breaks* the subject: it and every later row of the subject
are published, the ones with copies under a new id (:func:`~pyspark_jetstream.sink.encode.msg_ids.moved_id`, numbered for this
attempt: the server still remembers the old id, and the replay records read the suffix as the same
row), and their old copies are deleted once the new ones are stored: an attempt that dies before
leaves two copies, which the next retry's walk sorts out, never none.

:class:`RetryOrder` is the walk; :class:`RetryMoves` applies it to a task's frames and keeps what the
task must do afterwards (the stale copies to delete once every PubAck came, and the counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..encode.msg_ids import move_base
from .moves import is_conditional

_NONE: tuple[int, ...] = ()


@dataclass(frozen=True)
class Place:
    """What a row needs: ``publish`` it (else it is stored in place), and which stored copies of it to
    delete (once its new copy is stored, when it is published)."""

    publish: bool
    stale: tuple[int, ...] = _NONE

    @property
    def moved(self) -> bool:
        """A published row that the target held already (ahead of an earlier row of its subject)."""
        return self.publish and bool(self.stale)


class RetryOrder:
    """The walk of the module docstring, over one task's frames, in its publishing order."""

    def __init__(self, copies: Mapping[str, tuple[int, ...]]) -> None:
        """``copies``: ``{row id (no suffix): the sequences the target holds it at}``."""
        self.copies = copies
        self._last: dict[str, int] = {}  # subject -> sequence of its last row left in place
        self._broken: set[str] = set()

    def place(self, subject: str, msg_id: str) -> Place:
        seqs = self.copies.get(msg_id, _NONE)
        if subject not in self._broken:
            after = self._last.get(subject, 0)
            keep = min((s for s in seqs if s > after), default=None)
            if keep is not None:
                self._last[subject] = keep
                return Place(False, tuple(s for s in seqs if s != keep))
            self._broken.add(subject)
        return Place(True, tuple(sorted(seqs)))


class RetryMoves:
    """A replay with ``order=subject``: its frames walked in the task's order (module docstring), the rows stored
    past a missing one moved behind it, and their old copies to delete once the new ones are stored."""

    def __init__(self, stored: Mapping[str, tuple[int, ...]], deny_delete: bool, attempt_id: str,
                 bucket: bool) -> None:
        self.order = RetryOrder(stored)
        self.deny_delete = deny_delete
        self.bucket = bucket
        # :o<number> of this attempt's moved copies, apart from its predecessors' (whose ids the server
        # may still remember) and from the rounds of its own leader-change repairs (publisher).
        self.move_base = move_base(attempt_id)
        self.stale: list[tuple[int, tuple[int, ...]]] = []  # (position, copies to delete once it is stored)
        self.refused: set[int] = set()  # positions the server refused (their stale copies stay)
        self.moved = self.left_in_place = 0  # rows moved behind a missing one; ... that could not be moved
        self.already_stored = 0  # rows skipped: stored in place (or replaced) by an earlier attempt

    def in_order_behind(self, frames: list[tuple], already: Any, superseded: Any, pub: Any) -> list[tuple]:
        """The frames to publish, walked in the task's order: a row stored in place is skipped (counted as
        already stored); from the first row of a subject missing on, every row of it is published, the stored
        ones under this attempt's moved id (``pub.moved_copy``), their old copies deleted once the new ones are
        stored (:meth:`take_stale`). A target that refuses deletes keeps them where they are (counted, as the
        publisher's repair does), and so does a compare-and-set row (sent again behind the missing one it would
        be refused). ``already``: the ids the replay records found; ``superseded``: rows stored, then replaced."""
        order = self.order
        out = []
        for f in frames:
            subject, msg_id = f[2], f[4]  # OutFrame.subject, .msg_id
            if msg_id is None:
                out.append(f)
                continue
            if superseded is not None and msg_id not in already and superseded.covers(subject, msg_id):
                self.already_stored += 1  # stored, then replaced by later rows of its subject
                continue
            place = order.place(subject, msg_id)
            if not place.publish:
                self.already_stored += 1
                if place.stale and not self.deny_delete:
                    self.stale.append((-1, place.stale))  # a second copy: its copy in place is stored already
                continue
            if not place.moved:
                out.append(f)
                continue
            if (self.deny_delete and not self.bucket) or is_conditional(f):
                self.already_stored += 1
                self.left_in_place += 1
                continue
            out.append(pub.moved_copy(f))
            self.moved += 1
            if not self.deny_delete:
                self.stale.append((f[0], place.stale))
        return out

    def keep_refused(self, positions: set[int]) -> set[int]:
        """Of ``positions`` (refused by the server), the moved rows: their old copies stand, so each is counted
        among the rows left in place, never a dead letter or a failure while the row is stored (issue #54).
        Every refused position keeps its old copies (:meth:`take_stale`)."""
        self.refused |= positions
        moved = {position for position, _ in self.stale if position in positions}
        self.moved -= len(moved)
        self.left_in_place += len(moved)
        return moved

    def take_stale(self) -> list[int]:
        """The sequences of the copies moved rows left ahead of a missing one, to delete now that every new copy
        has its PubAck (a row the server refused keeps its old copy: never none)."""
        seqs = [seq for position, copies in self.stale if position not in self.refused for seq in copies]
        self.stale = []
        return seqs

"""A retried attempt finishes the order its predecessor left broken, free of I/O.

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
are published, the ones with copies under a new id (:func:`.reorder.moved_id`, numbered for this
attempt: the server still remembers the old id, and the replay records read the suffix as the same
row), and their old copies are deleted once the new ones are stored: an attempt that dies before
leaves two copies, which the next retry's walk sorts out, never none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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

"""Rows a replay must not publish again although the target no longer holds them, free of I/O.

**Why.** A replay past the duplicate window finds what its run stored by scanning the target for
the run's ``Nats-Msg-Id``s (``replay_guard``). A target that keeps only the last messages of each
subject (a bucket's ``history``, a stream's ``max_msgs_per_subject``) has removed a row whose key
the same run wrote again later: its id is nowhere to be found, and publishing the row again would
make a key's older value its latest (issue #33). Such a row was stored, and then replaced by
later rows of its run: a row is skipped when, among the messages of its subject that the scan
found, at least ``limit`` come after it in the run (or one of them rolled the subject up).

"After it in the run" is read from the ids themselves (``encoder.MsgIds``): a positional id
``<run>:<partition>:<position>`` orders rows of one task, a content id
``<run>:<stream>.<seq>:<digest>`` orders rows of one source stream; the sink publishes each
subject's rows in that order (option ``order=subject``). Ids of other shapes never cover a row.
"""

from __future__ import annotations

import bisect
import re

_POSITIONAL = re.compile(r"(\d+):(\d+)$")
_CONTENT = re.compile(r"([^:]+)\.(\d+):")


def order_key(run: str, msg_id: str) -> tuple[str, int] | None:
    """``(group, rank)``: rows of one group are published in rank order; None for another run's id
    or an id of no known shape."""
    prefix = f"{run}:"
    if not msg_id.startswith(prefix):
        return None
    rest = msg_id[len(prefix):]
    match = _POSITIONAL.match(rest)
    if match:
        return f"#{match.group(1)}", int(match.group(2))
    match = _CONTENT.match(rest)
    if match:
        return match.group(1), int(match.group(2))
    return None


class Superseded:
    """What the scan of a replay found, per subject: which rows of the run later rows replaced."""

    def __init__(self, run: str, limit: int | None) -> None:
        """``limit``: how many messages of a subject the target keeps (None, 0 or -1, the server's
        "unlimited": no such limit)."""
        self.run = run
        self.limit = limit if limit is not None and limit > 0 else 0
        self._ranks: dict[tuple[str, str], list[int]] = {}
        self._rollups: dict[tuple[str, str], int] = {}
        self._sorted = True

    def note_stored(self, subject: str, msg_id: str, rollup: bool = False) -> None:
        """A message of the run the target holds (``rollup``: it carries ``Nats-Rollup: sub``)."""
        key = order_key(self.run, msg_id)
        if key is None:
            return
        where = (subject, key[0])
        if rollup:
            self._rollups[where] = max(self._rollups.get(where, -1), key[1])
        if self.limit:
            self._ranks.setdefault(where, []).append(key[1])
            self._sorted = False

    def __bool__(self) -> bool:
        return bool(self._ranks or self._rollups)

    def covers(self, subject: str, msg_id: str | None) -> bool:
        """Whether the row published as ``msg_id`` on ``subject`` was stored and then replaced."""
        if msg_id is None:
            return False
        key = order_key(self.run, msg_id)
        if key is None:
            return False
        where = (subject, key[0])
        if self._rollups.get(where, -1) > key[1]:
            return True
        ranks = self._ranks.get(where)
        if not ranks:
            return False
        if not self._sorted:
            for values in self._ranks.values():
                values.sort()
            self._sorted = True
        return len(ranks) - bisect.bisect_right(ranks, key[1]) >= self.limit

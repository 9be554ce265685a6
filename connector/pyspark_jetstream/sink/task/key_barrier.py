"""Where a bucket write waits for a key's earlier rows: the barrier that makes pipelined compare-and-set
rows mean what nats-py's one-call-at-a-time ``KeyValue`` means (issue #54). Free of I/O.

A row that expects a key's last revision (``create``, ``update``, a compare-and-set) is checked by the
server against what the stream has *applied*. nats-py awaits every PubAck before its next call, so its
``kv.create`` after a ``kv.delete`` is checked against the delete. The sink pipelines its rows: on an R3
bucket the create is checked before the delete is applied (10071 against the old value, or 10164 while
the delete is in process), on any server a create refused and put again after its tombstone lands behind
the key's later rows. So, per task:

- a checked row whose key was sent since the last drain waits for a drain (every earlier row's PubAck,
  and the task's refusals settled, creates put again included), and goes alone: nothing after it is
  sent before it is settled, so the stream's sequences are those of nats-py's calls one at a time;
- a row of a key whose checked row was sent since the last drain waits likewise, so that a checked row
  put again (or refused) keeps its place among its key's rows.

Rows of other keys never wait, nor do keys without checked rows: a bucket write of plain puts, deletes
and purges is as pipelined as before. The keys sent since the last drain are bounded (:data:`MAX_KEYS`):
past it the task drains anyway, so memory does not grow with the task.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..publish.moves import is_conditional as is_checked  # a checked row: it expects its key's last revision

MAX_KEYS = 100_000
"""Keys remembered since the last drain; one more makes the next row wait for a drain."""


class KeyBarrier:
    """The keys sent since the last drain, and which of them had a checked row (module docstring)."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._sent: set[str] = set()
        self._checked: set[str] = set()

    def runs(self, frames: Sequence[tuple]) -> list[Sequence[tuple]]:
        """``frames`` cut where a row must wait: the task drains between two runs (the first run is empty
        when the first row waits)."""
        out: list[Sequence[tuple]] = []
        start = 0
        sent, checked = self._sent, self._checked
        for i, frame in enumerate(frames):
            key = frame[2]
            check = is_checked(frame)
            if check and key in sent:  # alone: settled (put again, say) before anything after it goes
                out.append(frames[start:i])
                out.append(frames[i:i + 1])
                start = i + 1
                sent.clear()
                checked.clear()
                continue
            if key in checked or len(sent) >= self.max_keys:
                out.append(frames[start:i])
                start = i
                sent.clear()
                checked.clear()
            sent.add(key)
            if check:
                checked.add(key)
        out.append(frames[start:])
        return out

    def drained(self) -> None:
        """Every row sent so far has its PubAck and its refusal settled."""
        self._sent.clear()
        self._checked.clear()

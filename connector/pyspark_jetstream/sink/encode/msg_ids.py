"""Deterministic message ids: what makes a retried task or a replayed micro-batch publish the same ids.

Each row without its own ``msg_id`` gets a ``Nats-Msg-Id`` made from its source position and content
when it carries a position, else from its task and position (:class:`MsgIds` says which and why). The
server drops a copy that arrives within the stream's duplicate window; past it, the replay records
(:mod:`~pyspark_jetstream.sink.records`) find the ids an earlier attempt stored. The hashed bytes
are joined column-wise by Arrow (:func:`content_keys`): no per-row Python work but the hash.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .layout import InputLayout
    from .rows import Columns

CONTENT_SEEN_MAX = 1 << 19
"""Content digests a task remembers to count repeats (about 50 MB); past this it starts over (:class:`MsgIds`)."""


class MsgIds:
    """The deterministic ``Nats-Msg-Id`` of each row of one task (option ``idempotent``).

    ``run`` is ``<queryId>:<batchId>`` for a streaming micro-batch (both survive a
    restart from the checkpoint) or a driver-made ``w<uuid>`` for a batch write.

    * Rows that carry a source position (this connector's ``stream`` and ``seq``
      columns, as every stream-to-stream copy does) get
      ``<run>:<stream>.<seq>:<digest>``, content-addressed: ``digest`` is 16 hex
      digits of a BLAKE2b hash (stable across processes, unlike ``hash()``) of
      what the row publishes and of its source message: the subject (a KV write's
      key, operation and expected revision), the data, the ``headers``, ``ttl``
      and ``expires_at`` columns when present, and the source's ``timestamp``
      when present (two servers' or domains' streams of one name hold different
      messages at the same ``seq``; their timestamps differ). So a replay gives
      every row the id it had, however the rows are split into tasks or whichever
      messages expired in between, and rows made from one message by any plan
      (a union, a join that fans it out into rows in different tasks, an
      ``explode``) get distinct ids as long as they differ in any of these.
    * Rows identical in all of that (``df.union(df)``) are told apart only inside
      one task, by an occurrence count: the second and later get ``.<k>``
      appended (k = 1, 2, ...), wherever they are in the task (the task counts
      up to :data:`CONTENT_SEEN_MAX` ids, then starts over). Identical rows in
      different tasks share an id: the server stores one, and the others show in
      the commit log line's "duplicates dropped by the server" count.
    * Other rows get ``<run>:<partition>:<position>``: stable as long as a replay
      gives the task the same rows in the same order (Spark's own sources and this
      connector's source, whose split is recorded with each offset, do).

    The shapes cannot collide: a stream name has no ``.``, a position is digits.
    """

    def __init__(self, run: str, partition: int) -> None:
        self.run = run
        self.partition = partition
        self._positional = f"{run}:{partition}:"
        self._seen: set[str] = set()  # the digests of (stream, seq, content) given out in this task
        self._repeats: dict[str, int] = {}

    def positional(self, position: int) -> str:
        return f"{self._positional}{position}"

    def positional_prefix(self) -> str:
        """What every positional id of this task starts with; the position follows."""
        return self._positional

    def content_prefix(self) -> str:
        """What every content id of this task starts with; ``<stream>.<seq>:`` follows."""
        return f"{self.run}:"

    def contents(self, prefixes: list[str | None], keys: list[bytes]) -> list[str | None]:
        """The content ids of rows whose ``<run>:<stream>.<seq>:`` is ``prefixes`` (None: no full
        position, left None for a positional id) and whose hashed bytes are ``keys`` (the
        encoder's, which begin with the stream and seq). Without repeats (the usual case) this is
        done by C loops (map, set); a batch with a repeat or a missing position takes a Python loop."""
        digests = list(map(_HEX, map(_DIGEST, keys)))
        seen = self._seen
        fresh = set(digests)
        if len(fresh) == len(digests) and seen.isdisjoint(fresh) and None not in prefixes:
            if len(seen) + len(fresh) > CONTENT_SEEN_MAX:
                seen.clear()
                self._repeats.clear()
            seen.update(fresh)
            return list(map(operator.add, prefixes, digests))
        repeats = self._repeats
        out: list[str | None] = []
        for prefix, digest in zip(prefixes, digests, strict=True):
            if prefix is None:
                out.append(None)
            elif digest in seen:
                k = repeats.get(digest, 0) + 1
                repeats[digest] = k
                out.append(f"{prefix}{digest}.{k}")
            else:
                if len(seen) >= CONTENT_SEEN_MAX:
                    seen.clear()
                    repeats.clear()
                seen.add(digest)
                out.append(prefix + digest)
        return out


_MOVED = re.compile(r":o\d+$")


def moved_id(msg_id: str, round_: int) -> str:
    """The id a message sent again after its stored copy was deleted carries (a subject's order repaired,
    publish/reorder.py): the server remembers the old id after the delete, so the copy needs its own."""
    return f"{base_id(msg_id)}:o{round_}"


def move_base(attempt: str) -> int:
    """Where the moved ids of task attempt ``attempt`` start numbering (``:o<move_base + round>``): apart from
    its predecessors', whose ids the server may still remember, and from its own repair rounds."""
    return int(hashlib.sha256(attempt.encode()).hexdigest()[:10], 16) * 1000


def base_id(msg_id: str) -> str:
    """The row's own id, whatever round of reordering stored it (the replay records read both as one row)."""
    return _MOVED.sub("", msg_id)


_DIGEST = functools.partial(hashlib.blake2b, digest_size=8)
"""A content id's hash: BLAKE2b, 8 bytes (16 hex digits); stable across processes, unlike ``hash()``."""


_HEX = operator.methodcaller("hexdigest")


def generated_ids(ids: MsgIds | None, layout: InputLayout, rows: Columns, live: list[int],
                  first: int) -> list[str | None]:
    """The deterministic id of every row in play (option ``idempotent``), in row order: a content
    id counts repeats across the task's rows, so it is made before any row is refused."""
    generated: list[str | None] = [None] * rows.n
    if ids is None:
        return generated
    lay = layout
    positional = ids.positional
    if lay.source_stream is None:
        for i in live:
            generated[i] = positional(first + i)
        return generated
    import pyarrow as pa
    import pyarrow.compute as pc

    stream, seq = rows.arrow(lay.source_stream), rows.arrow(lay.source_seq).cast(pa.string())
    prefixes = pc.binary_join_element_wise(ids.content_prefix(), stream, ".", seq, ":", "").to_pylist()
    keys = content_keys(layout, rows, stream, seq)  # (a null position gives no content id: never read)
    if len(live) == rows.n:
        made = ids.contents(prefixes, keys)
        if None not in made:
            return made
    else:
        made = ids.contents([prefixes[i] for i in live], [keys[i] for i in live])
    for i, msg_id in zip(live, made, strict=True):
        generated[i] = msg_id if msg_id is not None else positional(first + i)
    return generated

def content_keys(layout: InputLayout, rows: Columns, stream: Any, seq: Any) -> list[bytes]:
    """Per row, the bytes a content id hashes (:class:`MsgIds`), joined column-wise by Arrow: the
    source position, then every published column the input has (the layout fixes which, for
    every row of the query; the headers as their entries joined), text ones after their length,
    the data last."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lay, binary = layout, pa.binary()
    parts = [stream.cast(binary), seq.cast(binary)]
    for name in (lay.source_timestamp, lay.expires_at, lay.expected_revision):  # numbers
        if name is not None:
            column = rows.arrow(name)
            if pa.types.is_timestamp(column.type):
                column = column.cast(pa.int64())
            parts.append(column.cast(pa.string()).cast(binary))
    texts = [rows.arrow(name).cast(pa.string()) for name in (lay.subject, lay.key, lay.operation, lay.ttl)
             if name is not None]
    if lay.headers is not None:
        entries = rows.arrow(lay.headers)  # map<string, string | array<string>>, as entries
        offsets = entries.offsets  # a slice's map keeps the whole batch's entries: take its own
        low = offsets[0].as_py()
        count = offsets[len(offsets) - 1].as_py() - low
        keys, values = entries.keys.slice(low, count), entries.items.slice(low, count)
        if lay.headers_multi:
            values = pc.binary_join(values, "\x03")
        entry = pc.binary_join_element_wise(keys, values, "\x01", null_handling="replace", null_replacement="")
        per_row = pa.ListArray.from_arrays(pc.subtract(offsets, pa.scalar(low, offsets.type)), entry)
        texts.append(pc.binary_join(per_row, "\x02"))
    for text in texts:
        parts += [pc.utf8_length(text).cast(pa.string()).cast(binary), text.cast(binary)]
    parts.append(rows.arrow(lay.data).cast(binary))
    return pc.binary_join_element_wise(*parts, pa.scalar(b"\0", binary), null_handling="replace",
                                       null_replacement="").to_pylist()

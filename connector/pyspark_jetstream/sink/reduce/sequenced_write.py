"""A task's write with option ``sequenceBy``: the newest row per key, published under compare-and-set.

The pure parts (values, headers, the reduction) are in :mod:`.sequencer`; this module does the I/O
for one :class:`~pyspark_jetstream.sink.task.write.WriteTask`:

1. :meth:`SequencedWrite.reduce` feeds each Arrow batch to the task's
   :class:`~pyspark_jetstream.sink.reduce.sequencer.Reduction` (nothing is published yet);
2. :meth:`SequencedWrite.flush` (at the end of the task, or when the reduction is full) looks
   each key up once (its last message: revision and sequence header, pipelined direct gets),
   leaves out the rows not newer than the stored value (counted), and publishes the others in
   their own batches and positions (so their message ids are those of a write without the
   option) with the sequence header and ``Nats-Expected-Last-Subject-Sequence`` = the revision;
3. a publish refused because the key moved on (err_code 10071: another task or writer stored
   a value in between) is looked up again (from the stream leader), compared again and
   published again, at most :data:`MAX_TRIES` times.

Cost: one lookup and at most one publish per distinct key per flush, whatever the row count.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ...client import jsapi, runtime
from ...errors import PublishError
from ...protocol import kv
from ...protocol.frames import hpub_frame
from ...protocol.headers import EXPECTED_LAST_SUBJECT_SEQUENCE, SEQUENCE
from ..encode.frames import OutFrame
from ..encode.rows import RowChoice
from .sequencer import TAG_NAMES, Reduction, SequenceMismatch, encode_value, is_newer

MAX_TRIES = 10
"""Publishes of one key's row under compare-and-set before the task fails (each after a new lookup)."""


def _backoff(attempt: int) -> float:
    return min(0.5, 0.01 * 2 ** attempt) * (0.5 + random.random())


class SequencedWrite:
    def __init__(self, task: Any) -> None:
        """``task``: the :class:`~pyspark_jetstream.sink.task.write.WriteTask` that owns this write (its
        plan, encoder, publisher and counters; not imported here: the task imports this module)."""
        self.task = task
        plan = task.plan
        self.sequence = plan.sequence
        bucket = plan.options.bucket
        self.stream, self.prefix = kv.stream_name(bucket), kv.subject_prefix(bucket)
        self.reduction = Reduction(plan.layout.key, self.sequence.column, plan.layout.marker_reason)
        self.older_in_write = 0  # left out for a newer row of the same key in this task
        self.older_than_stored = 0  # not newer than the key's stored value

    def reduce(self, batch: Any, first: int) -> None:
        self.reduction.reduce(batch, first)
        if self.reduction.full:
            self.flush()

    # ---------------------------------------------------------------- flush

    def flush(self) -> None:
        batches, newest, superseded = self.reduction.take()
        self.older_in_write += superseded
        looked_up = [(p, k, v) for p, k, v in newest if kv.is_valid_key(k)]  # the encoder refuses the others
        stored = self._lookup([k for _, k, _ in looked_up], direct=self.sequence.direct)
        lines: dict[int, str] = {p: "" for p, k, _ in newest if not kv.is_valid_key(k)}
        pending: dict[int, tuple[str, Any, int]] = {}  # position -> key, value, expected revision
        for (position, key, value), last in zip(looked_up, stored, strict=True):
            if not self._newer(key, value, last, position):
                self.older_than_stored += 1
                continue
            lines[position] = self._lines(value, last.seq)
            pending[position] = (key, value, last.seq)
        column = self.sequence.column
        for kept in batches:
            publish = {i: lines[kept.first + i] for i in kept.newest if kept.first + i in lines}
            publish.update((i, "") for i in kept.passthrough)
            refuse = {i: (None, f"the row has no value in column '{column}' (option 'sequenceBy' orders the rows of "
                          "a key by it)", column) for i in kept.null_sequence}
            if publish or refuse:
                self.task.publish(kept.batch, kept.first, RowChoice(publish, refuse))
        self._settle(pending)

    def _lines(self, value: Any, revision: int) -> str:
        return (f"{SEQUENCE}: {encode_value(self.sequence.tag, value)}\r\n"
                f"{EXPECTED_LAST_SUBJECT_SEQUENCE}: {revision}\r\n")

    def _newer(self, key: str, value: Any, last: jsapi.LastMessage, position: int) -> bool:
        try:
            return is_newer(self.sequence.tag, value, jsapi.header_of(last, SEQUENCE))
        except SequenceMismatch as exc:
            raise PublishError(subject=f"{self.prefix}{key}", position=position, partition=self.task.partition,
                               reason=f"key '{key}': {exc}; option 'sequenceBy' ({self.sequence.column}, a "
                               f"{TAG_NAMES[self.sequence.tag]}) cannot compare them. Write this bucket with a "
                               "sequence column of the stored type, or delete the key first") from None

    def _lookup(self, keys: list[str], *, direct: bool) -> list[jsapi.LastMessage]:
        if not keys:
            return []
        opts = self.task.opts

        async def ask() -> list[jsapi.LastMessage]:
            nc = await runtime.connection(opts.connection)
            return await jsapi.last_messages(nc, self.stream, [f"{self.prefix}{k}" for k in keys], direct=direct,
                                             prefix=opts.api_prefix)

        return runtime.run(ask(), timeout=60 + len(keys) / 100)

    # ---------------------------------------------------------------- races

    def _settle(self, pending: dict[int, tuple[str, Any, int]]) -> None:
        """Drain; publishes refused because their key moved on (10071) are compared again and resent with the
        new revision; every other refusal goes to the task's own settling (dead letters or a failure)."""
        task = self.task
        pub = task.pub
        for attempt in range(MAX_TRIES):
            runtime.run(pub.drain())

            async def take() -> list:
                ours = [f for f in pub.failures if not f.dead_letter and f.position in pending
                        and f.err_code == jsapi.ERR_WRONG_LAST_SEQUENCE]
                taken = {id(f) for f in ours}  # by identity: a list scan per failure is quadratic
                pub.failures = [f for f in pub.failures if id(f) not in taken]
                return ours

            lost = runtime.run(take())
            task.settle()
            if not lost:
                return
            if attempt == MAX_TRIES - 1:
                f = min(lost, key=lambda f: f.position)
                key = pending[f.position][0]
                raise PublishError(subject=f"{self.prefix}{key}", position=f.position, partition=task.partition,
                                   reason=f"key '{key}' kept changing under other writers: {MAX_TRIES} compare-and-set "
                                   "publishes (option 'sequenceBy') were refused (wrong last sequence)",
                                   err_code=f.err_code)
            time.sleep(_backoff(attempt))
            # Ask the leader: a replica answering a direct get may not have the value that won yet.
            stored = self._lookup([pending[f.position][0] for f in lost], direct=False)
            frames = []
            for f, last in zip(lost, stored, strict=True):
                key, value, revision = pending[f.position]
                if not self._newer(key, value, last, f.position):
                    self.older_than_stored += 1
                    del pending[f.position]
                    continue
                sent = OutFrame._make(f.sent)
                block = sent.header_block.replace(f"{EXPECTED_LAST_SUBJECT_SEQUENCE}: {revision}\r\n".encode(),
                                                  f"{EXPECTED_LAST_SUBJECT_SEQUENCE}: {last.seq}\r\n".encode(), 1)
                frame = hpub_frame(sent.subject, f"{pub.reply_prefix}{sent.position}", block, sent.payload)
                frames.append(sent._replace(frame=frame, header_len=len(block)))
                pending[f.position] = (key, value, last.seq)
            if frames:
                runtime.run(pub.publish(frames))

"""A model of one stream's fast-ingest answers (ADR-50, ``fail`` mode) with seeded faults, on virtual time:
the other :class:`~pyspark_jetstream.client.transport.Transport` (issue #54).

The model answers as nats-server 2.15 does (tests/integration/test_fast_ingest.py runs the same paths
against a real one): message 1 gets ``{"type":"ack","seq":0,"msgs":F}``, every F-th message a flow ack,
a gap ``{"type":"gap"}`` and the final PubAck with the last contiguous count, a refused message
``{"type":"err"}`` then the final PubAck, a commit the final PubAck, a ping the last flow ack (or the
gap), and any message of a batch that is over 10208. The faults a :class:`Faults` draws from its seed:
a message lost on its way in (a gap), an answer lost, repeated or late (reordered), the batch forgotten
(an R1 restart: 10208 from then on), a leader change (a few messages lost, then 503 no responders), too
many open batches (429/10211) at a batch's message 1, a row the stream refuses (10166) wherever it is.

:class:`VirtualLoop` runs the publisher's waits (pings, deadlines, back-offs) on a clock that jumps to
the next timer when nothing is ready, so thousands of schedules take seconds, and a wait with no
deadline at all is a :class:`Hang`, not a stuck test.
"""

from __future__ import annotations

import asyncio
import json
import random
import selectors
from dataclasses import dataclass, field
from typing import Any

from pyspark_jetstream.protocol import fast_ingest as fi
from pyspark_jetstream.sink.encode.frames import ReplyForm
from pyspark_jetstream.sink.publish.row_publisher import RowPublisher

from .model_transport import ModelTransport, header


class Hang(RuntimeError):
    """Nothing was ready and no timer was set: something waits without a deadline."""


class _Instant(selectors.DefaultSelector):
    def __init__(self, limit: float) -> None:
        super().__init__()
        self.now, self.limit = 0.0, limit

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise Hang("the event loop would wait forever: nothing is ready and no timer is set")
        self.now += timeout
        if self.now > self.limit:
            raise Hang(f"still running after {self.limit:g} s of virtual time: a wait that never ends")
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to its next timer when nothing is ready (module docstring)."""

    def __init__(self, limit: float = 3600.0) -> None:
        self._instant = _Instant(limit)
        super().__init__(self._instant)

    def time(self) -> float:
        return self._instant.now


@dataclass
class Faults:
    """What goes wrong in one schedule, drawn from ``rng``."""

    rng: random.Random
    lose_in: float = 0.0  # a message lost on its way to the server
    lose_out: float = 0.0  # an answer lost on its way back
    repeat_out: float = 0.0  # an answer delivered twice
    late_out: float = 0.0  # an answer delivered late (after others)
    forget_at: int = 0  # the server forgets every batch at this arrival (0: never)
    leader_change_at: int = 0  # arrivals from here are lost, and one 503 answers (0: never)
    busy_at: int = 0  # the message 1 of this batch (1, 2, ... in the order they start) gets 429/10211 (0: never)
    refused: frozenset = frozenset()  # payloads the stream refuses (10166)

    @staticmethod
    def draw(rng: random.Random, payloads: list[bytes]) -> Faults:
        def maybe(p: float, value: float) -> float:
            return value if rng.random() < p else 0.0

        return Faults(rng, lose_in=maybe(0.3, rng.uniform(0.01, 0.1)), lose_out=maybe(0.4, rng.uniform(0.05, 0.3)),
                      repeat_out=maybe(0.3, 0.2), late_out=maybe(0.3, 0.3),
                      forget_at=rng.randint(1, 60) if rng.random() < 0.2 else 0,
                      leader_change_at=rng.randint(2, 60) if rng.random() < 0.2 else 0,
                      busy_at=rng.randint(1, 4) if rng.random() < 0.15 else 0,
                      refused=frozenset(rng.sample(payloads, k=min(len(payloads), rng.choice((0, 0, 1, 2))))))


@dataclass
class _Batch:
    flow: int
    received: int = 0  # messages 1..received arrived in order
    acked: int = 0
    over: bool = False


@dataclass
class Stored:
    subject: str
    msg_id: str | None
    payload: bytes


@dataclass
class ModelServer(ModelTransport):
    """One stream (module docstring); what it stores is in :attr:`stored`, every frame sent in :attr:`sent`."""

    faults: Faults
    stream: str = "S"
    flow_limit: int = 500
    is_clustered: bool = False
    stored: list[Stored] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)
    arrivals: int = 0
    stopped: bool = False  # the harness's mark: the write failed, nothing may be sent from here
    sent_after_stop: int = 0
    _ids: set = field(default_factory=set)
    _batches: dict = field(default_factory=dict)
    _handler: Any = None
    _starts: int = 0
    _changed_leader: bool = False
    _listeners: set = field(default_factory=set)
    row_answer: tuple[str, int] = ("", 0)  # what the last plain publish got

    def _on_send(self, buffer: bytes) -> None:
        self.sent.append(buffer)

    # ------------------------------------------------------------- the stream

    def _arrive(self, subject: str, reply: str, block: bytes, payload: bytes) -> None:
        faults, rng = self.faults, self.faults.rng
        where = _split(reply)
        if where is None:  # a per-row publish (the fall-back, RecordingRows): its own faults are modelled elsewhere
            self.row_answer = self._publish_row(subject, block, payload)
            return
        self.arrivals += 1
        if faults.forget_at and self.arrivals == faults.forget_at:
            for batch in self._batches.values():
                batch.over = True  # an R1 restart: every open batch is gone
        if faults.leader_change_at and self.arrivals >= faults.leader_change_at and not self._changed_leader:
            if self.arrivals < faults.leader_change_at + 3:
                return  # lost with the old leader
            self._changed_leader = True
            for batch in self._batches.values():
                batch.over = True
            self._answer(reply, b"", b"NATS/1.0 503\r\n\r\n")
            return
        if faults.lose_in and rng.random() < faults.lose_in:
            return
        batch_id, flow, k, op = where
        batch = self._batches.get(batch_id)
        if batch is None:
            if k != 1 or op != fi.OP_START and op != fi.OP_COMMIT:
                self._error(reply, 400, fi.ERR_UNKNOWN, "batch publish ID unknown")
                return
            self._starts += 1
            if self._starts == self.faults.busy_at:
                self._error(reply, 429, fi.ERR_TOO_MANY, "batch publish too many inflight")
                return
            batch = self._batches[batch_id] = _Batch(min(flow, self.flow_limit))
        if batch.over:
            self._error(reply, 400, fi.ERR_UNKNOWN, "batch publish ID unknown")
            return
        if op == fi.OP_PING:
            if k > batch.received:
                self._gap(reply, batch, k)
            else:
                self._answer(reply, json.dumps({"type": "ack", "seq": batch.acked, "msgs": batch.flow}).encode())
            return
        if k != batch.received + 1:
            if k > batch.received + 1:
                self._gap(reply, batch, k)
            return  # a repeat of what arrived already: the server ignores it
        if op == fi.OP_COMMIT_EOB:
            self._final(reply, batch, batch.received)
            return
        if payload in self.faults.refused:
            error = {"code": 400, "err_code": 10166, "description": "per-message TTL is disabled"}
            self._answer(reply, json.dumps({"type": "err", "seq": k, "error": error}).encode())
            self._final(reply, batch, batch.received)
            return
        self._store(subject, block, payload)
        batch.received = k
        if op == fi.OP_COMMIT:
            self._final(reply, batch, k)
            return
        if k == 1:
            self._answer(reply, json.dumps({"type": "ack", "seq": 0, "msgs": batch.flow}).encode())
        elif k % batch.flow == 0:
            batch.acked = k
            self._answer(reply, json.dumps({"type": "ack", "seq": k, "msgs": batch.flow}).encode())

    def _publish_row(self, subject: str, block: bytes, payload: bytes) -> tuple[str, int]:
        """A plain publish: ("refused", 10166), ("duplicate", 0) or ("stored", its sequence)."""
        if payload in self.faults.refused:
            return "refused", 10166
        seq = self._store(subject, block, payload)
        return ("stored", seq) if seq else ("duplicate", 0)

    def _store(self, subject: str, block: bytes, payload: bytes) -> int:
        msg_id = header(block, "Nats-Msg-Id")
        if msg_id is not None and msg_id in self._ids:
            return 0  # a duplicate: skipped, counted
        if msg_id is not None:
            self._ids.add(msg_id)
        self.stored.append(Stored(subject, msg_id, payload))
        return len(self.stored)

    def _gap(self, reply: str, batch: _Batch, k: int) -> None:
        self._answer(reply, json.dumps({"type": "gap", "last_seq": batch.received + 1, "seq": k}).encode())
        self._final(reply, batch, batch.received)

    def _final(self, reply: str, batch: _Batch, count: int) -> None:
        batch.over = True
        self._answer(reply, json.dumps({"stream": self.stream, "seq": len(self.stored), "count": count}).encode())

    def _error(self, reply: str, code: int, err_code: int, description: str) -> None:
        error = {"code": code, "err_code": err_code, "description": description}
        self._answer(reply, json.dumps({"error": error, "stream": self.stream, "seq": 0}).encode())

    def _answer(self, reply: str, data: bytes, headers: bytes | None = None) -> None:
        faults, rng = self.faults, self.faults.rng
        if faults.lose_out and rng.random() < faults.lose_out:
            return
        times = 2 if faults.repeat_out and rng.random() < faults.repeat_out else 1
        loop = asyncio.get_running_loop()
        for _ in range(times):
            if faults.late_out and rng.random() < faults.late_out:
                loop.call_later(rng.uniform(0.001, 0.05), self._deliver, reply, data, headers)
            else:
                loop.call_soon(self._deliver, reply, data, headers)

    def _deliver(self, reply: str, data: bytes, headers: bytes | None) -> None:
        if self._handler is not None:
            self._handler(reply.encode(), b"", data, headers)


class RecordingRows(RowPublisher):
    """The per-row publisher a :class:`~pyspark_jetstream.sink.publish.batched.BatchedPublisher` falls back on
    (and sends dead letters through), on the model: each frame stored as a plain publish with its PubAck."""

    def __init__(self, model: ModelServer) -> None:
        self.model = model
        self.reply_prefix = "_INBOX.rows."
        self.low_water = 8
        self.counts = {"stored": 0, "duplicates": 0}
        self._failures: list = []

    reply_form = property(lambda self: ReplyForm(self.reply_prefix))
    stored = property(lambda self: self.counts["stored"])
    duplicates = property(lambda self: self.counts["duplicates"])
    dead_lettered = reordered = left_out_of_order = moves_finished = restored = batches = property(lambda self: 0)

    @property
    def failures(self) -> list:
        return self._failures

    @failures.setter
    def failures(self, value: list) -> None:
        self._failures = list(value)

    def moved_copy(self, sent: tuple) -> tuple:
        raise AssertionError("a batched write moves nothing")

    async def delete_stored(self, seqs: list[int]) -> int:
        raise AssertionError("a batched write deletes nothing")

    async def publish(self, frames: list[tuple], *, dead_letter: bool = False) -> None:
        from pyspark_jetstream.sink.publish.acks import AckFailure

        for sent in frames:
            await asyncio.sleep(0)  # a PubAck per row takes the loop's turns: others may run between rows
            await self.model.send(sent[1])
            outcome, value = self.model.row_answer
            if outcome == "refused":
                self._failures.append(AckFailure(sent[0], sent, 400, value, "per-message TTL is disabled", dead_letter))
            else:
                self.counts["duplicates" if outcome == "duplicate" else "stored"] += 1

    async def drain(self) -> None:
        return None

    async def abort(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _split(reply: str) -> tuple[str, int, int, int] | None:
    """(batch id, flow, k, op) of a batch's reply subject, None for a plain one."""
    tokens = reply.split(".")
    if len(tokens) < 7 or tokens[-1] != fi.SUFFIX:
        return None
    return tokens[-6], int(tokens[-5]), int(tokens[-3]), int(tokens[-2])


"""A model of one clustered stream as the per-row publisher sees it, with seeded faults (issue #54): the
:class:`~pyspark_jetstream.client.transport.Transport` the harness gives
:class:`~pyspark_jetstream.sink.publish.publisher.Publisher`, and the stream reads its ordered recovery makes.

The model answers as nats-server 2.15 does to a plain publish (tests/integration/test_cluster*.py run the
same paths against a real R3 cluster): a PubAck ``{"stream","seq"}`` for a message stored, the original's
sequence with ``"duplicate": true`` for an id inside the duplicate window, an error for a refused one (10077,
a per-subject limit), and a 503 status while no leader is elected. The faults a :class:`RowFaults` draws:
a leader change (a run of messages lost with the old leader, then 503s), PubAcks lost (the message stored)
or repeated or late, a reconnect (messages lost, then the publisher told), rows the stream refuses and moved
copies it refuses, a duplicate window shorter than the outage, and a kill: the task dies before the stream's
k-th change (a message stored or deleted), in the middle of a send or a move.

The stream reads are the API requests (``STREAM.INFO``, ``STREAM.MSG.GET``, ``STREAM.MSG.DELETE``) and the two
scans of :mod:`~pyspark_jetstream.sink.records.replay_guard` the recovery makes, which the harness points here.
Time is the event loop's (tests/unit/fast_ingest_model.py's :class:`VirtualLoop`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

from pyspark_jetstream.sink.encode.msg_ids import base_id

from .model_transport import ModelTransport, header

STREAM = "S"


class Killed(ConnectionError):
    """The task died: nothing more reaches the stream."""


@dataclass
class RowFaults:
    """What goes wrong in one attempt, drawn from ``rng``."""

    rng: random.Random
    lose_at: int = 0  # a leader change: arrivals from here are lost with the old leader (0: never)
    lose_for: int = 0
    no_leader_for: int = 0  # then this many arrivals get a 503 while the new leader is elected
    silent: float = 0.0  # a message stored whose PubAck is lost
    repeat_out: float = 0.0  # a PubAck delivered twice
    late_out: float = 0.0  # a PubAck delivered late (after others)
    reconnect_at: int = 0  # this arrival and the next two are lost, then the publisher hears of a reconnect
    refused: frozenset = frozenset()  # payloads the stream refuses (10077) under their own id
    refuse_moves: float = 0.0  # a moved copy refused by the same limit
    window: float = math.inf  # the duplicate window, in seconds
    kill_at: int = 0  # the task dies before the stream's kill_at-th change (0: never)

    @staticmethod
    def draw(rng: random.Random, payloads: list[bytes], clustered: bool, ordered: bool) -> RowFaults:
        """``ordered``: the publisher looks in the stream before it resends, so the duplicate window may be shorter
        than the outage; without it (``order=none``) a resend relies on the window (docs/guarantees.md)."""
        def maybe(p: float, value: float) -> float:
            return value if rng.random() < p else 0.0

        change = clustered and rng.random() < 0.5
        return RowFaults(
            rng, lose_at=rng.randint(1, 30) if change else 0, lose_for=rng.randint(0, 6),
            no_leader_for=rng.randint(0, 4) if clustered else 0, silent=maybe(0.25, rng.uniform(0.02, 0.2)),
            repeat_out=maybe(0.2, 0.2), late_out=maybe(0.3, 0.3),
            reconnect_at=rng.randint(1, 40) if rng.random() < 0.15 else 0,
            refused=frozenset(rng.sample(payloads, k=min(len(payloads), rng.choice((0, 0, 0, 1, 2))))),
            refuse_moves=maybe(0.1, 0.5), window=rng.choice((math.inf, math.inf, 1.0, 3.0) if ordered else (math.inf, 30.0)),
            kill_at=rng.randint(1, 60) if rng.random() < 0.25 else 0)


class _Reply:
    def __init__(self, body: dict) -> None:
        self.data = json.dumps(body).encode()


@dataclass
class RowStream(ModelTransport):
    """One clustered stream (module docstring): :attr:`messages` is what it holds, by sequence."""

    faults: RowFaults
    is_clustered: bool = True
    messages: dict[int, tuple[str, str | None, bytes]] = field(default_factory=dict)  # seq -> subject, id, payload
    ever_stored: set = field(default_factory=set)  # the rows (base ids) the stream held at some point
    stopped: bool = False  # the harness's mark: the write failed, nothing may be sent from here
    sent_after_stop: int = 0
    dead: bool = False  # killed: the task's connection is gone
    arrivals: int = 0
    changes: int = 0
    _ids: dict = field(default_factory=dict)  # msg id -> (seq, when stored): the duplicate window
    _last_seq: int = 0
    _handler: Any = None
    _listeners: set = field(default_factory=set)

    def revive(self, faults: RowFaults) -> None:
        """A new attempt (Spark's retry of the task) on a new connection: the stream keeps what it holds."""
        self.faults, self.dead, self.stopped, self.arrivals, self.changes = faults, False, False, 0, 0
        now = asyncio.get_running_loop().time()
        self._ids = {msg_id: (seq, now) for msg_id, (seq, _) in self._ids.items()}  # the retry comes in time

    answers_in_runs = True

    def _on_send(self, buffer: bytes) -> None:
        if self.dead:
            raise Killed("the task's connection is gone")

    @property
    def closed(self) -> bool:
        return self.dead

    # ------------------------------------------------------------- publishes

    def _arrive(self, subject: str, reply: str, block: bytes, payload: bytes) -> None:
        faults, rng = self.faults, self.faults.rng
        self.arrivals += 1
        n = self.arrivals
        if faults.reconnect_at and faults.reconnect_at <= n < faults.reconnect_at + 3:
            if n == faults.reconnect_at:
                loop = asyncio.get_running_loop()
                for listener in list(self._listeners):
                    loop.call_later(0.1, listener.on_reconnected)
            return
        if faults.lose_at and faults.lose_at <= n < faults.lose_at + faults.lose_for:
            return  # lost with the old leader
        if faults.lose_at and faults.lose_at + faults.lose_for <= n < faults.lose_at + faults.lose_for + \
                faults.no_leader_for:
            self._answer(reply, b"", b"NATS/1.0 503\r\n\r\n")
            return
        msg_id = header(block, "Nats-Msg-Id")
        moved = msg_id is not None and base_id(msg_id) != msg_id
        if (payload in faults.refused and not moved) or (moved and rng.random() < faults.refuse_moves):
            error = {"code": 400, "err_code": 10077, "description": "maximum messages per subject exceeded"}
            self._answer(reply, json.dumps({"error": error, "stream": STREAM, "seq": 0}).encode())
            return
        now = asyncio.get_running_loop().time()
        known = self._ids.get(msg_id) if msg_id is not None else None
        duplicate = known is not None and now - known[1] < faults.window
        if duplicate:
            seq = known[0]
        else:
            self._change()
            self._last_seq += 1
            seq = self._last_seq
            self.messages[seq] = (subject, msg_id, payload)
            self.ever_stored.add(base_id(msg_id) if msg_id else payload)
            if msg_id is not None:
                self._ids[msg_id] = (seq, now)
        if faults.silent and rng.random() < faults.silent:
            return
        ack = {"stream": STREAM, "seq": seq, **({"duplicate": True} if duplicate else {})}
        self._answer(reply, json.dumps(ack).encode())

    def _change(self) -> None:
        """The stream changes (a message stored or deleted): where a kill may come first."""
        if self.faults.kill_at and self.changes + 1 >= self.faults.kill_at:
            self.dead = True
            raise Killed(f"killed before change {self.changes + 1}")
        self.changes += 1

    def _answer(self, reply: str, data: bytes, headers: bytes | None = None) -> None:
        faults, rng = self.faults, self.faults.rng
        loop = asyncio.get_running_loop()
        for _ in range(2 if faults.repeat_out and rng.random() < faults.repeat_out else 1):
            if faults.late_out and rng.random() < faults.late_out:
                loop.call_later(rng.uniform(0.001, 0.3), self._deliver, reply, data, headers)
            else:
                loop.call_soon(self._deliver, reply, data, headers)

    def _deliver(self, reply: str, data: bytes, headers: bytes | None) -> None:
        if self._handler is not None and not self.dead:
            self._handler([(reply.encode(), b"", data, headers)])

    # ------------------------------------------------------------- the stream reads (an ``nc`` for jsapi)

    async def request(self, subject: str, payload: bytes, timeout: float = 10.0, headers: Any = None) -> _Reply:
        await asyncio.sleep(0.01)  # a request waits for its reply: the loop runs others meanwhile
        if self.dead:
            raise Killed("the task's connection is gone")
        if subject == f"$JS.API.STREAM.INFO.{STREAM}":
            return _Reply({"config": {"name": STREAM, "deny_delete": False}, "state": {"last_seq": self._last_seq}})
        body = json.loads(payload)
        if subject == f"$JS.API.STREAM.MSG.GET.{STREAM}":  # the first message at or after seq
            held = sorted(s for s in self.messages if s >= body["seq"])
            if not held:
                return _Reply({"error": {"code": 404, "err_code": 10037, "description": "no message found"}})
            subj, _, data = self.messages[held[0]]
            return _Reply({"message": {"subject": subj, "seq": held[0], "data": base64.b64encode(data).decode()}})
        assert subject == f"$JS.API.STREAM.MSG.DELETE.{STREAM}", subject
        if body["seq"] not in self.messages:
            return _Reply({"error": {"code": 400, "err_code": 10057, "description": "no message found"}})
        self._change()
        self.messages.pop(body["seq"])  # the id stays in the duplicate window, as the server keeps it
        return _Reply({"success": True})

    async def stored_sequences(self, nc, stream, api_prefix, after, wanted, deadline) -> dict[str, int]:
        await asyncio.sleep(0.01)
        if self.dead:
            raise Killed("the task's connection is gone")
        return {msg_id: seq for seq, (_, msg_id, _) in self.messages.items() if seq > after and msg_id in wanted}

    async def moved_copies(self, nc, stream, api_prefix, after, bases, deadline) -> dict[str, list[int]]:
        await asyncio.sleep(0.01)
        if self.dead:
            raise Killed("the task's connection is gone")
        found: dict[str, list[int]] = {}
        for seq, (_, msg_id, _) in sorted(self.messages.items()):
            if seq > after and msg_id and base_id(msg_id) != msg_id and base_id(msg_id) in bases:
                found.setdefault(base_id(msg_id), []).append(seq)
        return found


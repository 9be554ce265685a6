"""What a publisher needs of the network, behind one small interface (issue #54).

:class:`Transport` is the whole of it: an inbox, one raw subscription for the answers, frames sent (and
taken back after a failure), whether the connection is closed or goes to a cluster, and a listener told
when it closes. :class:`NatsTransport` is the one over a nats-py connection (through
:mod:`.nats_internals`, the one module that owns nats-py's internals); the fault-schedule harness
(tests/unit/fast_ingest_model.py, tests/unit/per_row_model.py) is the other, a model of the server's answers,
so the publishers' rare branches run thousands of times without a server. Both the per-row
:class:`~pyspark_jetstream.sink.publish.publisher.Publisher` and the
:class:`~pyspark_jetstream.client.fast_publisher.FastPublisher` send through it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from .nats_internals import events_of, is_clustered, raw_subscribe, raw_unsubscribe
from .outbox import Outbox

Answer = Callable[[bytes, bytes, bytes, "bytes | None"], None]
"""(subject, reply, data, header block or None) of one message received."""


class Transport(ABC):
    """The network as a publisher sees it (module docstring)."""

    @abstractmethod
    def new_inbox(self) -> str: ...

    @abstractmethod
    async def subscribe(self, subject: str, answer: Answer, answers: Callable[[list], None]) -> Any:
        """Deliver every message on ``subject`` to ``answer`` (or a run of them to ``answers``); a handle."""

    @abstractmethod
    async def unsubscribe(self, handle: Any) -> None: ...

    @abstractmethod
    async def send(self, buffer: bytes) -> None:
        """Hand protocol frames to the connection."""

    @abstractmethod
    def take_back(self) -> int:
        """Drop what the connection still holds of this transport's frames (it is down): how many."""

    @property
    @abstractmethod
    def closed(self) -> bool: ...

    @property
    @abstractmethod
    def clustered(self) -> bool:
        """Whether the server is part of a cluster (a 503 may then be a leader being elected)."""

    @abstractmethod
    def watch(self, listener: Any) -> None:
        """Tell ``listener.on_closed(cause)`` when the connection closes."""

    @abstractmethod
    def unwatch(self, listener: Any) -> None: ...

    def now(self) -> float:
        """The clock deadlines are kept by: the event loop's (monotonic; a harness may run it on virtual time)."""
        return asyncio.get_running_loop().time()


class NatsTransport(Transport):
    """A :class:`Transport` over a nats-py connection."""

    def __init__(self, nc: Any) -> None:
        self._nc = nc
        self._outbox = Outbox(nc)

    def new_inbox(self) -> str:
        return self._nc.new_inbox()

    async def subscribe(self, subject: str, answer: Answer, answers: Callable[[list], None]) -> Any:
        return await raw_subscribe(self._nc, subject, answer, answers)

    async def unsubscribe(self, handle: Any) -> None:
        await raw_unsubscribe(self._nc, handle)

    async def send(self, buffer: bytes) -> None:
        await self._outbox.send(buffer)

    def take_back(self) -> int:
        return self._outbox.take_back()

    @property
    def closed(self) -> bool:
        return bool(self._nc.is_closed)

    @property
    def clustered(self) -> bool:
        return is_clustered(self._nc)

    def watch(self, listener: Any) -> None:
        events_of(self._nc).listeners.add(listener)

    def unwatch(self, listener: Any) -> None:
        events_of(self._nc).listeners.discard(listener)

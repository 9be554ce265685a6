"""A per-process asyncio loop on a daemon thread, and the connections it keeps.

Spark calls data source methods synchronously, while nats-py is asyncio-only.
One loop per Python process, running on its own thread, keeps connections
alive between tasks (pings answered, reconnects handled) so that reused Python
workers keep one connection per set of connection options across micro-batches.
The loop is created lazily and re-created after a fork (a new PID).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..options import ConnectionOptions

T = TypeVar("T")

_lock = threading.Lock()
_state: dict[str, Any] = {"pid": None, "loop": None, "connections": {}}


def _loop() -> asyncio.AbstractEventLoop:
    with _lock:
        if _state["pid"] != os.getpid() or _state["loop"] is None or _state["loop"].is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="pyspark-jetstream-io", daemon=True)
            thread.start()
            _state.update(pid=os.getpid(), loop=loop, connections={})
        return _state["loop"]


def loop() -> asyncio.AbstractEventLoop:
    """The I/O loop of this process (started on first use)."""
    return _loop()


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None, *, note_after: float | None = None,
        on_delay: Callable[[], None] | None = None) -> T:
    """Run ``coro`` on the I/O loop and wait for its result (from any other thread). With ``note_after``,
    ``on_delay()`` is called once when ``coro`` has not finished that many seconds in (a request answered
    only after a reconnect fails nothing, yet the wait is worth a word)."""
    future = asyncio.run_coroutine_threadsafe(coro, _loop())
    try:
        if note_after is not None and on_delay is not None and (timeout is None or timeout > note_after):
            try:
                return future.result(note_after)
            except concurrent.futures.TimeoutError:
                on_delay()
            timeout = None if timeout is None else timeout - note_after
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise


def submit(coro: Coroutine[Any, Any, T]):
    """Schedule ``coro`` on the I/O loop; returns a concurrent.futures.Future."""
    return asyncio.run_coroutine_threadsafe(coro, _loop())


async def _get_connection(opts: ConnectionOptions):
    from .connection import open_connection

    connections: dict[ConnectionOptions, Any] = _state["connections"]
    pending = connections.get(opts)
    if pending is None or (pending.done() and (pending.exception() or pending.result().is_closed)):
        pending = asyncio.ensure_future(open_connection(opts))
        connections[opts] = pending
    try:
        return await asyncio.shield(pending)
    except BaseException:
        if connections.get(opts) is pending:
            del connections[opts]
        raise


def connection(opts: ConnectionOptions):
    """The shared connection for ``opts`` (opened on first use). Call on the loop thread."""
    return _get_connection(opts)

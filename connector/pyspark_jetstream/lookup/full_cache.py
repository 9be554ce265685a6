"""A Python worker's full copy of a bucket (``cache=full``), as Flink's ``lookup.cache=FULL``, kept up to date
by a KV watch instead of a reload on a schedule.

One copy per bucket and connection in a worker process, shared by its tasks (Spark reuses Python workers):
an ordered consumer, deliver last per subject, then every change, as nats-py's ``watchall`` makes one, fills
it, on the process's I/O loop (not ``watchall`` itself: its entries carry the time through a float, rounded to the nearest microsecond
where the stored time is cut to it, one microsecond off at times). A lookup waits for the first full load, then answers from
memory: an answer is as fresh as the watch, which follows the bucket by a network hop. More than
``cacheMaxRows`` live keys fail every lookup of the copy, naming the bound; a watch that stops (its
connection closed) is started again by the next lookup.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from nats.js.api import DeliverPolicy

from ..client import runtime
from ..errors import JetStreamConnectorError
from ..options import LookupOptions
from ..protocol.ack_subject import parse_ack_subject
from ..protocol.headers import KV_OPERATION, MARKER_REASON
from ..source.columns.rows import KV_OPERATION_OF_MARKER
from .cache import Entry

_copies: dict[tuple, FullCopy] = {}
_lock = threading.Lock()


class FullCopy:
    """One bucket's entries in a worker (module docstring)."""

    def __init__(self, opts: LookupOptions) -> None:
        self._opts = opts
        self.entries: dict[str, Entry] = {}
        self.failure: BaseException | None = None
        self._loaded: asyncio.Event | None = None
        self._task: asyncio.Future | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self.entries, self.failure, self._loaded = {}, None, None
        self._task = runtime.submit(self._watch())

    async def _watch(self) -> None:
        """The bucket's last message per key, then every change, through nats-py's ordered push consumer (it
        re-creates itself after a gap); the entries' sequence and time from each message's ack subject."""
        self._loaded = asyncio.Event()
        try:
            nc = await runtime.connection(self._opts.connection)
            js = nc.jetstream(prefix=self._opts.api_prefix)
            sub = await js.subscribe(f"$KV.{self._opts.bucket}.>", stream=f"KV_{self._opts.bucket}", cb=self._apply,
                                     ordered_consumer=True, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                                     inactive_threshold=300)
            if (await sub.consumer_info()).num_pending == 0 and not self.entries:
                self._loaded.set()  # an empty bucket: nothing will be delivered to say so
            while self.failure is None:
                await asyncio.sleep(1)  # the subscription's callback does the work; a failure ends the copy
            await sub.unsubscribe()
        except Exception as exc:  # noqa: BLE001 - kept for every lookup of this copy to raise
            self.failure = self.failure or exc
        finally:
            self._loaded.set()

    async def _apply(self, msg: Any) -> None:
        meta = parse_ack_subject(msg.reply)
        key = msg.subject[len(f"$KV.{self._opts.bucket}."):]
        headers = msg.headers or {}
        reason = headers.get(MARKER_REASON)
        if headers.get(KV_OPERATION) in ("DEL", "PURGE") or reason in KV_OPERATION_OF_MARKER:
            self.entries.pop(key, None)
        elif reason is None:
            self.entries[key] = (msg.data or b"", meta.stream_seq, meta.timestamp_ns // 1000)
            if len(self.entries) > self._opts.cache_max_rows:
                self.failure = JetStreamConnectorError(
                    f"KV bucket '{self._opts.bucket}' holds more than {self._opts.cache_max_rows:,} keys, the "
                    "lookup's full cache bound (option 'cacheMaxRows'): raise it, or use cache='partial'.")
        if meta.pending == 0:
            self._loaded.set()  # the first full load is in (and stays so)

    async def _wait_loaded(self) -> None:
        while self._loaded is None:
            await asyncio.sleep(0.01)  # the watch task has not run yet
        await self._loaded.wait()

    def lookup(self, keys: list[str]) -> dict[str, Entry]:
        """The entries of ``keys`` once the first load is in (at most the lookup's ``timeout``)."""
        try:
            runtime.run(self._wait_loaded(), timeout=self._opts.timeout)
        except TimeoutError:
            raise JetStreamConnectorError(f"The full cache of KV bucket '{self._opts.bucket}' was not loaded within "
                                          f"{self._opts.timeout:g}s (option 'timeout').") from None
        if self.failure is not None:
            raise JetStreamConnectorError(f"The full cache of KV bucket '{self._opts.bucket}' failed: "
                                          f"{self.failure}") from None
        entries = self.entries  # changed by the watch on the I/O loop: one get per key
        found = ((key, entries.get(key)) for key in keys)
        return {key: entry for key, entry in found if entry is not None}


def full_copy(opts: LookupOptions) -> FullCopy:
    """This worker's copy of ``opts``' bucket, started (again) if it is not running."""
    key: tuple[Any, ...] = (opts.connection, opts.api_prefix, opts.bucket, opts.cache_max_rows)
    with _lock:
        copy = _copies.get(key)
        if copy is None:
            copy = _copies[key] = FullCopy(opts)
        if not copy.running and copy.failure is None:
            copy.start()
        elif not copy.running and copy.failure is not None and not isinstance(copy.failure, JetStreamConnectorError):
            copy.start()  # the watch stopped (a connection closed): started again
    return copy

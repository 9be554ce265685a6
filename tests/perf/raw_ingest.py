"""The server's own ingest limit: pre-built frames over a plain socket, a client that costs next to nothing.

Used by ``bench_fast_ingest.py`` beside nats-py and our publishers. Every message is what the sink
sends (``Nats-Msg-Id`` and ``Nats-Expected-Stream``), made before the clock starts; the client only
writes buffers and reads the answers, so the rate is what the server stores, not what a Python
publisher feeds it:

- ``server, PubAcks``: a PubAck per message, 4,096 in flight (the sink's default window);
- ``server, batches``: one fast-ingest batch in ``fail`` mode, flow 500, message 1 alone, then two
  flow intervals ahead of the last flow ack (ADR-50's advice), the commit on the last message.

A minimal NATS client on purpose (CONNECT, SUB, HPUB, MSG/HMSG, PING): nats-py's parser and futures
are what the other publishers measure.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from urllib.parse import urlparse

WINDOW = 4096
READ_DEADLINE = 30.0


class RawConnection:
    """One socket to a server: writes buffers, yields (subject, payload) of the messages it gets."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.buffer = reader, writer, b""

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        parsed = urlparse(url.split(",")[0])
        reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        await asyncio.wait_for(reader.readline(), READ_DEADLINE)  # INFO
        writer.write(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
                     b'"protocol":1}\r\n')
        return cls(reader, writer)

    async def _more(self) -> None:
        data = await asyncio.wait_for(self.reader.read(1 << 20), READ_DEADLINE)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    async def answers(self) -> list[tuple[bytes, bytes]]:
        """(subject, payload) of every whole MSG and HMSG received so far (at least one), in order;
        PINGs answered."""
        found: list[tuple[bytes, bytes]] = []
        while not found:
            await self._more()
            buffer, at = self.buffer, 0
            while True:
                end = buffer.find(b"\r\n", at)
                if end < 0:
                    break
                line = buffer[at:end]
                if line.startswith((b"MSG ", b"HMSG ")):
                    parts = line.split()
                    size = int(parts[-1])
                    if len(buffer) < end + 4 + size:
                        break
                    body = buffer[end + 2:end + 2 + size]
                    found.append((parts[1], body[int(parts[-2]):] if line.startswith(b"HMSG") else body))
                    at = end + 4 + size
                    continue
                if line == b"PING":
                    self.writer.write(b"PONG\r\n")
                at = end + 2
            self.buffer = buffer[at:]
        return found

    def close(self) -> None:
        self.writer.close()


def _frame(subject: str, reply: str, msg_id: str, stream: str, payload: bytes, ttl: str | None = None) -> bytes:
    ttl_line = f"Nats-TTL: {ttl}\r\n" if ttl else ""
    header = f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n{ttl_line}Nats-Expected-Stream: {stream}\r\n\r\n".encode()
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(header),
                                              len(header) + len(payload), header, payload)


async def pubacks(url: str, stream: str, messages: list, ttl: str | None = None,
                  on_start: Callable[[], None] | None = None) -> float:
    """Seconds to store ``messages`` with a PubAck each, ``WINDOW`` in flight (``ttl``: a
    ``Nats-TTL`` header on each; ``on_start``: called as the clock starts, the frames made)."""
    conn = await RawConnection.open(url)
    frames = [_frame(subject, f"_RA.{k}", msg_id, stream, payload, ttl)
              for k, (subject, _h, payload, msg_id) in enumerate(messages)]
    conn.writer.write(b"SUB _RA.* 1\r\n")
    if on_start is not None:
        on_start()
    started = time.perf_counter()
    sent, acked, total = 0, 0, len(frames)
    while acked < total:
        upto = min(total, acked + WINDOW)
        if upto - sent >= 256 or (upto == total and sent < total):
            conn.writer.write(b"".join(frames[sent:upto]))
            sent = upto
            await conn.writer.drain()
        answers = await conn.answers()
        refused = [data for _subject, data in answers if b'"error"' in data]
        if refused:
            raise RuntimeError(refused[0])
        acked += len(answers)
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


async def batch(url: str, stream: str, messages: list, outstanding: int = 2, ttl: str | None = None,
                on_start: Callable[[], None] | None = None) -> float:
    """Seconds to store ``messages`` in one fast-ingest batch (``fail`` mode, flow 500; ``ttl``: a
    ``Nats-TTL`` header on each; ``on_start``: called as the clock starts, the frames made)."""
    conn = await RawConnection.open(url)
    total = len(messages)
    head = "_RB.b1.500.fail."
    frames = [_frame(subject, f"{head}{k}.{2 if k == total else 0 if k == 1 else 1}.$FI", msg_id, stream, payload, ttl)
              for k, (subject, _h, payload, msg_id) in enumerate(messages, 1)]
    conn.writer.write(b"SUB _RB.b1.> 1\r\n")
    if on_start is not None:
        on_start()
    started = time.perf_counter()
    conn.writer.write(frames[0])
    [(_subject, data)] = await conn.answers()
    every, acked, sent, done = json.loads(data)["msgs"], 0, 1, False
    while not done:
        upto = min(total, acked + outstanding * every)
        if sent < upto:
            conn.writer.write(b"".join(frames[sent:upto]))
            sent = upto
            await conn.writer.drain()
        for _subject, data in await conn.answers():
            answer = json.loads(data)
            if answer.get("type") == "ack":
                acked, every = max(acked, answer["seq"]), answer["msgs"]
            elif answer.get("count") == total:
                done = True
            else:
                raise RuntimeError(answer)
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed

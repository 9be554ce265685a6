"""The ceiling: a minimal NATS client over a plain socket, measuring what nats-server itself allows.

Benchmark-only (never in the package; no auth, TLS or reconnects). Two measurements, the same
work as the connector's paths and in the same run:

- :func:`pull_to_arrow`: one consumer, ``CONSUMER.MSG.NEXT`` pulls of 10k refilled at half,
  every MSG/HMSG frame parsed from the socket buffer in a tight loop and appended to the
  connector's own :class:`~pyspark_jetstream.source.columns.rows.BatchBuilder`, built into the same
  Arrow batches every 10k messages;
- :func:`pull_frames`: the same pulls by two consumers in parallel with nothing built, only the
  frames counted: what the server itself delivers (the headered reads are compared on it);
- :func:`publish`: ``HPUB`` frames with ``Nats-TTL`` and ``Nats-Msg-Id`` (what the sink sends),
  a reply subject per frame under one wildcard subscription, at most ``window`` PubAcks
  outstanding, every PubAck checked.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = b""

    @classmethod
    async def open(cls, url: str) -> _Conn:
        host, port = url.split("://", 1)[-1].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 24)
        conn = cls(reader, writer)
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
                     b'"protocol":1}\r\nPING\r\n')
        await writer.drain()
        while (await reader.readline()).strip() != b"PONG":
            pass
        return conn

    def frames(self, chunk: bytes):
        """Yield ``(subject, reply, headers, payload)`` of every complete MSG/HMSG in the buffer; answer PINGs."""
        buf = self.buf + chunk
        pos = 0
        while True:
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            line = buf[pos:end]
            if line.startswith(b"MSG "):
                parts = line.split(b" ")
                size = int(parts[-1])
                if len(buf) < end + 2 + size + 2:
                    break
                reply = parts[3] if len(parts) == 5 else b""
                yield parts[1], reply, None, buf[end + 2:end + 2 + size]
                pos = end + 2 + size + 2
            elif line.startswith(b"HMSG "):
                parts = line.split(b" ")
                hlen, total = int(parts[-2]), int(parts[-1])
                if len(buf) < end + 2 + total + 2:
                    break
                reply = parts[3] if len(parts) == 6 else b""
                start = end + 2
                yield parts[1], reply, buf[start:start + hlen], buf[start + hlen:start + total]
                pos = start + total + 2
            else:
                if line == b"PING":
                    self.writer.write(b"PONG\r\n")
                pos = end + 2
        self.buf = buf[pos:]

    async def request(self, subject: str, body: dict) -> dict:
        inbox = f"_CEIL.{uuid.uuid4().hex}"
        data = json.dumps(body).encode()
        self.writer.write(f"SUB {inbox} 99\r\nPUB {subject} {inbox} {len(data)}\r\n".encode() + data + b"\r\n")
        await self.writer.drain()
        while True:
            for _subject, _reply, _headers, payload in self.frames(await self.reader.read(1 << 16)):
                self.writer.write(b"UNSUB 99\r\n")
                return json.loads(payload)


async def pull_to_arrow(url: str, stream: str, count: int, batch: int = 10_000) -> float:
    from pyspark_jetstream.source.columns.rows import BatchBuilder

    builder = BatchBuilder(stream)

    def take(subject: bytes, ack: bytes, headers: bytes | None, payload: bytes) -> None:
        tokens = ack.split(b".")
        builder.add(subject, payload, headers, int(tokens[-4]), int(tokens[-2]))
        if len(builder) >= batch:
            builder.build()

    start = time.perf_counter()
    await _pull(url, stream, 1, count, take, batch)
    if len(builder):
        builder.build()
    return time.perf_counter() - start


async def pull_frames(url: str, stream: str, count: int, readers: int = 2) -> float:
    """What the server delivers, with nothing built: ``readers`` consumers in parallel (as the
    connector's partitions), each pulling its share of ``1..count`` and only counting frames."""
    share = count // readers

    def take(subject: bytes, ack: bytes, headers: bytes | None, payload: bytes) -> None:
        return None

    start = time.perf_counter()
    await asyncio.gather(*(_pull(url, stream, 1 + k * share, share if k < readers - 1 else count - k * share, take)
                           for k in range(readers)))
    return time.perf_counter() - start


async def _pull(url: str, stream: str, first: int, count: int, take, batch: int = 10_000) -> None:
    """One consumer from ``first`` on, ``CONSUMER.MSG.NEXT`` pulls of ``batch`` refilled at half,
    ``take(subject, ack, headers, payload)`` for each of ``count`` messages."""
    conn = await _Conn.open(url)
    name = f"ceil{uuid.uuid4().hex[:8]}"
    reply = await conn.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": {
        "name": name, "ack_policy": "none", "deliver_policy": "by_start_sequence", "opt_start_seq": first,
        "mem_storage": True, "num_replicas": 1}})
    assert "error" not in reply, reply
    inbox = f"_CEIL.{uuid.uuid4().hex}"
    pull = f"PUB $JS.API.CONSUMER.MSG.NEXT.{stream}.{name} {inbox} "
    conn.writer.write(f"SUB {inbox} 1\r\n".encode())
    got = pending = 0

    def ask(n: int) -> None:
        nonlocal pending
        body = json.dumps({"batch": n, "expires": 30 * 10**9}).encode()
        conn.writer.write(f"{pull}{len(body)}\r\n".encode() + body + b"\r\n")
        pending += n

    ask(min(batch, count))
    while got < count:
        for subject, ack, headers, payload in conn.frames(await conn.reader.read(1 << 20)):
            if not ack:
                continue  # a status: the range is sized so that none ends a pull early
            take(subject, ack, headers, payload)
            got += 1
            pending -= 1
        if got < count and pending < batch // 2:
            want = min(batch - pending, count - got - pending)
            if want > 0:
                ask(want)
    conn.writer.close()


async def publish(url: str, stream: str, rows: int, size: int, window: int = 10_000) -> float:
    conn = await _Conn.open(url)
    inbox = f"_CEIL.{uuid.uuid4().hex}"
    conn.writer.write(f"SUB {inbox}.* 1\r\n".encode())
    payload = b"x" * size
    acked = errors = 0
    start = time.perf_counter()
    sent = 0
    while acked < rows:
        if sent < rows and sent - acked < window:
            chunk = []
            for i in range(sent, min(rows, sent + window - (sent - acked))):
                block = f"NATS/1.0\r\nNats-Msg-Id: ceil-{i}\r\nNats-TTL: 1h\r\n\r\n".encode()
                chunk.append(f"HPUB {stream}.s{i % 8} {inbox}.{i} {len(block)} {len(block) + size}\r\n".encode()
                             + block + payload + b"\r\n")
            sent += len(chunk)
            conn.writer.write(b"".join(chunk))
            await conn.writer.drain()
        for _subject, _reply, _headers, data in conn.frames(await conn.reader.read(1 << 20)):
            acked += 1
            if not data or b'"error"' in data:
                errors += 1
    elapsed = time.perf_counter() - start
    conn.writer.close()
    assert errors == 0, f"{errors} publishes refused"
    return elapsed

"""The sink's PubAck path alone, ordered beside unordered (issue #39: order costs nothing when nothing goes wrong).

    python tests/perf/bench_acks.py [frames]

The write benchmark runs on one server, where the ordered publisher (``order=subject`` in a cluster) is
off; this measures what it adds to every frame where it is on. A :class:`Publisher` on a fake clustered
connection (no server, no socket) is handed frames a window at a time, and their plain PubAcks in runs
of 40, as nats-py's parser hands them; the two modes alternate, five runs each, medians kept. Prints
microseconds per frame: the whole loop, and the PubAck handling alone.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from pyspark_jetstream.sink.publish.publisher import Publisher

WINDOW, RUN = 10_000, 40


class _FakeClusteredConnection:
    is_closed = False
    _server_info = {"cluster": "fake"}  # is_clustered: the ordered recovery is on
    _pending: list = []

    def new_inbox(self) -> str:
        return "_INBOX.bench"


async def _one(ordered: bool, frames: int) -> tuple[float, float]:
    pub = Publisher(_FakeClusteredConnection(), max_pending=WINDOW, ack_timeout=30, idempotent=True,
                    ordered_stream="S" if ordered else None)
    pub.reply_prefix = "_INBOX.bench."
    pub.window.prefix_len = len(pub.reply_prefix)

    async def send(buffer: bytes) -> None:  # nothing leaves: the PubAcks are made below
        return None

    pub.send = send
    seq = position = 0
    acks = 0.0
    started = time.perf_counter()
    while position < frames:
        n = min(WINDOW // 2, frames - position)
        await pub.publish([(p, b"HPUB\r\n", f"S.s{p % 8}", None, f"id-{p}", 10, 100)
                           for p in range(position, position + n)])
        replies = []
        for p in range(position, position + n):
            seq += 1
            replies.append((f"_INBOX.bench.{p}".encode(), b"", b'{"stream":"S","seq":%d}' % seq, None))
        t = time.perf_counter()
        for i in range(0, n, RUN):
            pub.acks.on_frames(replies[i:i + RUN])
        acks += time.perf_counter() - t
        position += n
    assert pub.stored == frames and not pub.window.inflight, (pub.stored, len(pub.window.inflight))
    return time.perf_counter() - started, acks


def main() -> None:
    frames = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(5):
        for ordered in ((False, True) if r % 2 == 0 else (True, False)):
            times[ordered].append(asyncio.run(_one(ordered, frames)))
    for ordered in (False, True):
        whole = statistics.median(t[0] for t in times[ordered]) * 1e6 / frames
        acks = statistics.median(t[1] for t in times[ordered]) * 1e6 / frames
        print(f"{'ordered  ' if ordered else 'unordered'}: {whole:.2f} us a frame, of which PubAcks {acks:.2f} us")


if __name__ == "__main__":
    main()

"""Batched direct gets of a bucket's keys (``client/direct_get.py``, issue #38), against the session's
real nats-server: 2.15.1 from the venv, 2.11.11 in the compat cell ps41 (``.ci/compat``), where
``Nats-Num-Pending`` of a ``multi_last`` batch is counted differently.

What is checked: a batch cut by the server's byte limit is continued until every key asked is
answered (69 keys of 1,000,000 bytes: 64 MB per batch); a ``404 Message Not Found`` is asked again,
not read as "none" (injected by a relay on the real server: the race that causes it cannot be
timed); every chunk of 1,024 keys reads the same sequence; a mirror behind that sequence (a
bucket's mirror answers its direct gets) hides no key."""

from __future__ import annotations

import asyncio

import pytest

from pyspark_jetstream.client import direct_get
from pyspark_jetstream.client.direct_get import last_of_subjects
from pyspark_jetstream.client.nats_internals import raw_subscribe, send_raw

from ..helpers import SyncNats, wait_until

RELAY_PREFIX = "$RELAY.API"


@pytest.fixture
def leader_lookups(monkeypatch):
    """The subjects looked up on the leader (the real lookups, counted)."""
    asked: list[str] = []
    real = direct_get.leader_last

    async def counted(nc, stream, subject, **kwargs):
        asked.append(subject)
        return await real(nc, stream, subject, **kwargs)

    monkeypatch.setattr(direct_get, "leader_last", counted)
    return asked


def _bucket(client: SyncNats, name: str, **config):
    return client.run(client.js.create_key_value(bucket=name, direct=True, **config))


def _read(client: SyncNats, bucket: str, keys: list[str], **kwargs) -> dict[str, tuple[int, bytes]]:
    found = client.run(last_of_subjects(client.nc, f"KV_{bucket}", [f"$KV.{bucket}.{k}" for k in keys], **kwargs),
                       timeout=120)
    subjects = [m.subject for m in found]
    assert len(subjects) == len(set(subjects)), "a key answered twice"
    return {m.subject.decode().split(".", 2)[2]: (m.seq, m.data) for m in found}


def test_a_batch_cut_by_max_bytes_is_continued_until_every_key_is_answered(nats_client, stream_name, leader_lookups):
    """64 MB (the server's max_pending) per batch: 69 keys of 1,000,000 bytes take two. On 2.11 the
    first batch's EOB says no key is left (``Nats-Num-Pending: 0``) while one is."""
    bucket = stream_name
    kv = _bucket(nats_client, bucket)
    keys = [f"k{i}" for i in range(69)]
    for i, key in enumerate(keys):
        nats_client.run(kv.put(key, bytes([i]) * 1_000_000))
    got = _read(nats_client, bucket, keys + ["absent"], up_to=69)
    assert sorted(got) == sorted(keys)
    assert all(data == bytes([i]) * 1_000_000 for i, (_, data) in enumerate(got[k] for k in keys))
    assert leader_lookups == [f"$KV.{bucket}.absent"]  # the direct gets found all 69 themselves


NOT_FOUND = b"NATS/1.0 404 Message Not Found\r\n\r\n"
NO_RESPONDERS = b"NATS/1.0 503\r\n\r\n"
STATUS_503 = b"NATS/1.0 503"  # the status line, whatever description follows it


class _Relay:
    """``$RELAY.API.>`` relayed to ``$JS.API.>`` on the same server, frame by frame (header blocks
    intact), except that the first ``fail`` direct gets end with ``status`` after ``keep`` messages:
    ``404 Message Not Found`` as nats-server ends a batch whose resolved message is gone when loaded,
    ``503`` as a stream none of whose stores answers direct gets just now answers.

    ``server_503s`` counts the direct gets the server itself answered 503 (the reader asks those
    again too)."""

    def __init__(self, url: str, fail: int, keep: int, status: bytes = NOT_FOUND) -> None:
        self.client = SyncNats(url)
        self.fail, self.keep, self.status = fail, keep, status
        self.direct_gets = self.server_503s = 0
        self.client.run(self._start())

    async def _start(self) -> None:
        nc = self.client.nc
        self.out: asyncio.Queue = asyncio.Queue()
        self.sender = asyncio.ensure_future(self._send())
        await nc.subscribe(f"{RELAY_PREFIX}.>", cb=self._request)
        await nc.flush()  # the server has the subscription before any request is relayed (else: no responders)

    async def _send(self) -> None:
        while True:
            frame = await self.out.get()
            await send_raw(self.client.nc, frame)

    def _frame(self, to: str, headers: bytes | None, data: bytes) -> bytes:
        if headers is None:
            return f"PUB {to} {len(data)}\r\n".encode() + data + b"\r\n"
        return f"HPUB {to} {len(headers)} {len(headers) + len(data)}\r\n".encode() + headers + data + b"\r\n"

    async def _request(self, msg) -> None:
        nc = self.client.nc
        api = msg.subject[len(RELAY_PREFIX) + 1:]
        cut = None
        if api.startswith("DIRECT.GET."):
            self.direct_gets += 1
            if self.direct_gets <= self.fail:
                cut = self.keep
        sent = [0]
        inbox = nc.new_inbox()

        def relay(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            if cut is None and sent[0] == 0 and (headers or b"").startswith(STATUS_503):
                self.server_503s += 1
            if cut is not None and sent[0] >= cut:
                if sent[0] == cut:  # once: then the rest of the batch is dropped
                    self.out.put_nowait(self._frame(msg.reply, self.status, b""))
                sent[0] += 1
                return
            sent[0] += 1
            self.out.put_nowait(self._frame(msg.reply, headers, data))

        await raw_subscribe(nc, inbox, relay)
        await nc.publish(f"$JS.API.{api}", msg.data, reply=inbox)

    def close(self) -> None:
        async def stop() -> None:
            self.sender.cancel()

        self.client.run(stop())
        self.client.close()


@pytest.mark.parametrize("status, keep", [(NOT_FOUND, 0), (NOT_FOUND, 1), (NO_RESPONDERS, 0)],
                         ids=["not-found-0", "not-found-1", "no-responders"])
def test_message_not_found_is_asked_again_not_read_as_none(nats_server, nats_client, stream_name, leader_lookups,
                                                           status, keep):
    """``404 Message Not Found`` (before any message, or after one) is a race on the server, and a
    ``503`` a moment when no store answers direct gets (a replica catching up): the batch is asked
    again at the same sequence, and no key is left out or looked up elsewhere."""
    bucket = stream_name
    kv = _bucket(nats_client, bucket)
    for key in ("a", "b", "c"):
        nats_client.run(kv.put(key, key.encode()))
    relay = _Relay(nats_server.url, fail=2, keep=keep, status=status)
    try:
        got = _read(nats_client, bucket, ["a", "b", "c"], up_to=3, prefix=RELAY_PREFIX, patience=10)
    finally:
        relay.close()
    assert {k: v for k, (_, v) in got.items()} == {"a": b"a", "b": b"b", "c": b"c"}
    assert relay.direct_gets - relay.server_503s == 3 and leader_lookups == []


def test_no_responders_until_the_deadline_fails_naming_allow_direct(nats_server, nats_client, stream_name):
    bucket = stream_name
    kv = _bucket(nats_client, bucket)
    nats_client.run(kv.put("a", b"a"))
    relay = _Relay(nats_server.url, fail=10**6, keep=0, status=NO_RESPONDERS)
    try:
        with pytest.raises(Exception, match=r"gave up after 1s: no responders \(503\).*allow_direct"):
            _read(nats_client, bucket, ["a"], up_to=1, prefix=RELAY_PREFIX, patience=1)
    finally:
        relay.close()
    assert relay.direct_gets >= 2  # asked again before the deadline


def test_message_not_found_without_end_fails_at_the_deadline(nats_server, nats_client, stream_name):
    bucket = stream_name
    kv = _bucket(nats_client, bucket)
    nats_client.run(kv.put("a", b"a"))
    relay = _Relay(nats_server.url, fail=10**6, keep=0)
    try:
        with pytest.raises(Exception, match="Message Not Found"):
            _read(nats_client, bucket, ["a"], up_to=1, prefix=RELAY_PREFIX, patience=1)
    finally:
        relay.close()


def test_every_chunk_reads_the_keys_at_the_sequence_asked(nats_client, stream_name, leader_lookups):
    """Two chunks (1,030 keys), both at ``up_to`` though every key changed since; with one value kept
    per key (history 1) the values at ``up_to`` are gone, and every key reads its newer value (looked
    up on the leader) rather than none."""
    keys = [f"k{i}" for i in range(1030)]
    for history in (2, 1):
        bucket = f"{stream_name}H{history}"
        kv = _bucket(nats_client, bucket, history=history)
        for key in keys:
            nats_client.run(kv.put(key, b"old"))
        for key in keys:
            nats_client.run(kv.put(key, b"new"))
        got = _read(nats_client, bucket, keys, up_to=len(keys))
        assert sorted(got) == sorted(keys)
        if history == 2:
            assert {v for _, v in got.values()} == {b"old"} and leader_lookups == []
        else:
            assert {v for _, v in got.values()} == {b"new"} and len(leader_lookups) == len(keys)


def test_a_mirror_behind_the_sequence_asked_hides_no_key(nats_client, stream_name, leader_lookups):
    """A mirror of a bucket answers the bucket's direct gets (``mirror_direct`` follows the origin's
    ``allow_direct``). This one holds key ``a`` only, so its last sequence stays behind: asked at the
    bucket's end it answers "No Results", and without ``up_to_seq`` only ``a``."""
    bucket = stream_name
    kv = _bucket(nats_client, bucket)
    nats_client.run(kv.put("a", b"a1"))
    nats_client.run(kv.put("b", b"b1"))
    config = {"name": f"M{bucket}", "mirror": {"name": f"KV_{bucket}", "filter_subject": f"$KV.{bucket}.a"}}
    created = nats_client.api(f"STREAM.CREATE.M{bucket}", config)
    assert created.get("config", {}).get("mirror_direct") is True, created
    nats_client.run(kv.put("a", b"a2"))
    nats_client.run(kv.put("b", b"b2"))
    nats_client.run(kv.put("b", b"b3"))

    def mirrored() -> bool:
        return nats_client.api(f"STREAM.INFO.M{bucket}")["state"]["last_seq"] == 3

    wait_until(mirrored, what="the mirror holds a2")
    for _ in range(16):  # the queue group picks the bucket or the mirror for each request
        got = _read(nats_client, bucket, ["a", "b"], up_to=5)
        assert {k: v for k, (_, v) in got.items()} == {"a": b"a2", "b": b"b3"}
    assert leader_lookups  # the mirror answered at least once in 16 requests: the keys it lacked were looked up

"""Pipelined JetStream publishing with every PubAck awaited.

One wildcard subscription ``<inbox>.*`` receives the PubAcks; each frame's reply
subject is ``<inbox>.<position>``, so an ack names the row it answers without
any per-message future. At most ``max_pending`` frames are unacknowledged at
once (the window); frames go into nats-py's write buffer in chunks, which is
what makes this about twice as fast as ``js.publish_async`` (issue #2's probe).

Frames go out through :func:`pyspark_jetstream.client.nats_internals.send_raw` (nats-py's write
buffer, no ``Msg`` per frame): the public ``publish`` cannot send multi-valued
headers and costs a coroutine call per message.

Model: Spark's ``KafkaWriteTask``: bounded in-flight sends, keep the first
failure, flush and re-check at the end, always close.

Clustered JetStream adds two transient failures, both handled by sending the
same frame again (the server drops a copy that was stored after all, by its
``Nats-Msg-Id``):

- a ``503`` (no responders) while a stream is between leaders: no server took
  the message, so a resend is always safe; it is retried every
  ``RETRY_503_INTERVAL`` until ``ackTimeout`` has passed since the first 503.
  On a single server a 503 means no stream captures the subject, so it fails
  at once.
- silence: frames sent to a node that dies, or to a leader that steps down
  before it replicated them, get no reply at all. With idempotent publishing,
  in-flight frames are resent on every reconnect and, in a cluster, after
  ``RESEND_AFTER_SILENCE`` without any PubAck. Without message ids a resend
  could store a copy, so those frames are left to ``ackTimeout``.

Sent again after later frames of their subject were stored, those frames would land behind
them. With ``ordered`` (the sink's ``order=subject`` in a cluster, one target stream, ids on),
any such trouble (a 503, a PubAck that overtakes an older frame, silence, a reconnect) stops
new sends and runs a recovery instead (:mod:`.reorder`): every frame in flight answered or
quiet, the messages of a subject stored ahead of one of its unanswered frames deleted, and all
of them sent again in the task's order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import time
from dataclasses import dataclass

from ...client.nats_internals import raw_subscribe, raw_unsubscribe
from ...errors import AckTimeoutError, JetStreamConnectorError
from ...protocol.headers import EXPECTED_LAST_SUBJECT_SEQUENCE, parse_status
from ...protocol.puback import DUPLICATE, ERROR, may_be_plain, parse_puback

RETRY_503_INTERVAL = 0.25
"""Seconds between resends of frames answered by 503 in a cluster (nats.go's publish retry wait)."""

RESEND_AFTER_SILENCE = 2.0
"""Seconds without any PubAck after which a clustered, idempotent publisher resends what is in flight."""

DEAD_LETTER_TAG = "d"
"""Reply-token prefix that marks a dead-letter publish (``<inbox>.d<position>``)."""

QUIET = 0.5
"""Seconds without any reply after which an ordered recovery takes the frames still unanswered as lost."""

_ACK_SEQ = re.compile(rb'"seq"\s*:\s*(\d+)')


_CONDITIONAL = f"\r\n{EXPECTED_LAST_SUBJECT_SEQUENCE}:".encode()


def _conditional(sent: tuple) -> bool:
    """Whether a frame (OutFrame layout) expects its subject's last sequence (a compare-and-set)."""
    frame, header_len, payload_len = sent[1], sent[5], sent[6]
    end = len(frame) - 2 - payload_len
    return _CONDITIONAL in frame[end - header_len:end]


def _status_of(headers: bytes | None) -> int:
    """The status code of an empty reply (``NATS/1.0 503`` when no stream took the message)."""
    return parse_status(headers)[0] if headers else 0


@dataclass(frozen=True)
class AckFailure:
    """A publish the server did not store; ``sent`` is what was handed to :meth:`Publisher.publish`
    for it (the :class:`~pyspark_jetstream.sink.encoder.OutFrame` layout)."""

    position: int
    sent: tuple
    code: int
    err_code: int | None
    description: str
    dead_letter: bool


class Publisher:
    _move_base = 0  # see __init__

    def __init__(self, nc, *, max_pending: int, ack_timeout: float, idempotent: bool = False,
                 ordered_stream: str | None = None, api_prefix: str = "$JS.API", bucket: bool = False,
                 move_base: int = 0) -> None:
        self._nc = nc
        self._idempotent = idempotent
        # 503 means "between leaders" only where there are leaders to elect.
        from ...client.nats_internals import is_clustered

        self._retry_503 = is_clustered(nc)
        # Ordered recovery (module docstring): every frame to one stream, ids to resend safely, a cluster.
        self._ordered = ordered_stream is not None and idempotent and self._retry_503
        self._stream, self._api_prefix, self._bucket = ordered_stream, api_prefix, bucket
        self._send_no = 0
        # ordered: token -> the number of the frame's first send, oldest first. A resend keeps it: what may be
        # forgotten (_forget_settled) and where a lost PubAck's frame is looked for (_find_stored) depend on
        # when the frame was first sent, not on when it was last resent. OrderedDicts: every PubAck asks for
        # the oldest entry, which a plain dict finds only by skipping the slots of the entries deleted before
        # it (up to a window's worth per PubAck); an OrderedDict's linked list gives it at once.
        self._pending: collections.OrderedDict[str, int] = collections.OrderedDict()
        # ordered: token -> (send no, position, subject, seq, sent)
        self._stored_recent: collections.OrderedDict[str, tuple] = collections.OrderedDict()
        self._max_seq = 0  # ordered: the highest stream sequence a PubAck gave
        self._floors: collections.deque[tuple[int, int]] = collections.deque()  # (first send no, _max_seq then)
        self.found_after_loss = 0  # frames whose PubAck was lost that the stream held (not sent again)
        self._may_send = asyncio.Event()
        self._may_send.set()
        self._recovery: asyncio.Task | None = None
        self._last_reply = time.monotonic()
        self._rounds = 0
        # Moved copies are numbered from here (``:o<move_base + round>``): a retried attempt numbers its own
        # apart from its predecessors' (retry_order), whose copies it may delete while the server still
        # remembers their ids.
        self._move_base = move_base
        self._again = False
        self.reordered = 0  # messages deleted and published again in their subject's order
        self.left_out_of_order = 0  # ... that the stream would not let the sink delete
        self._first_503: dict[str, float] = {}
        self._retry_due: set[str] = set()
        self._retry_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # background resends (see _track)
        self._send_error: BaseException | None = None
        self._last_resend = 0.0
        self.resent = 0
        self._max_pending = max_pending
        # Refill at half the window (like ADR-37's threshold); 0 for a window of 1. The writer encodes
        # in slices of this size.
        self.low_water = max_pending // 2
        self._ack_timeout = ack_timeout
        self._inflight: dict[str, tuple] = {}  # reply token -> what was sent (OutFrame layout)
        self._room = asyncio.Event()
        self._room.set()
        self._done = asyncio.Event()
        self._done.set()
        self._last_progress = time.monotonic()
        self.failures: list[AckFailure] = []
        self.stored = 0
        self.duplicates = 0
        self.dead_lettered = 0
        self._sub = None
        self.reply_prefix = ""
        self._closed: str | None = None  # why the connection closed for good, once it has
        self._unwritten: list[bytes] = []  # buffers handed to nats-py that may still wait in its write buffer

    async def start(self) -> Publisher:
        from ...client.nats_internals import events_of

        events_of(self._nc).listeners.add(self)
        inbox = self._nc.new_inbox()
        self.reply_prefix = inbox + "."
        self._prefix_len = len(self.reply_prefix)
        # PubAcks arrive as raw frames, straight from nats-py's parser: no Msg, queue or task per ack.
        self._sub = await raw_subscribe(self._nc, inbox + ".*", self._on_ack_frame, self._on_ack_frames)
        return self

    def _on_ack_frame(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Called by nats-py's parser for a PubAck it parsed itself: as one of a run."""
        self._on_ack_frames(((subject, reply, data, headers),))

    def _on_ack_frames(self, frames: list) -> None:
        """The PubAcks one socket read brought, in order (nats_internals' fast frame path): must never
        raise into the read loop; a failure here fails the write (the next wait raises it) instead of
        losing the ack to a log line. A plain "stored" ack is settled here and the window's events are
        set once for the run; every other ack (an error, a duplicate, a dead letter's, a status) takes
        :meth:`_on_ack`, in its place in the run.

        Ordered, a plain ack of the oldest frame in flight while order is not in doubt (no recovery, nothing
        remembered: :meth:`_in_order`) is settled here too, with no bookkeeping: it is stored in its place,
        and :meth:`_on_ordered_ack` would remember it only to forget it at once. The run's last such ack
        gives the highest sequence (PubAcks come in send order); the floors are pruned once per run.
        Anything else takes :meth:`_on_ordered_ack`."""
        inflight, first_503, cut = self._inflight, self._first_503, self._prefix_len
        stored = 0
        ordered = self._ordered
        last_in_order = None  # ordered: the body of the run's last ack settled in order
        if ordered:
            self._last_reply = time.monotonic()
            pending = self._pending
            in_order = self._in_order()
        try:
            for subject, _reply, data, headers in frames:
                token = subject[cut:].decode()
                if ordered:
                    if (in_order and data and may_be_plain(data) and pending and next(iter(pending)) == token
                            and inflight.pop(token, None) is not None):
                        pending.popitem(last=False)  # the oldest (a dead letter's token is never pending)
                        stored += 1
                        last_in_order = data
                        continue
                    self._on_ordered_ack(token, data, headers)
                    in_order = self._in_order()
                    continue
                # A cheap pre-check: an ack it cannot vouch for (a stream named 'error') is parsed.
                if data and may_be_plain(data) and not token.startswith(DEAD_LETTER_TAG):
                    if inflight.pop(token, None) is not None:
                        if first_503:
                            first_503.pop(token, None)
                        stored += 1
                    continue
                self._on_ack(token, data, headers)
        except Exception as exc:
            if self._send_error is None:
                self._send_error = exc
            self._room.set()
            self._done.set()
        finally:
            if last_in_order is not None:
                found = _ACK_SEQ.search(last_in_order)
                if found is not None and int(found.group(1)) > self._max_seq:
                    self._max_seq = int(found.group(1))
                if self._calm():
                    self._forget_settled()
            if stored:
                self.stored += stored
                self._last_progress = time.monotonic()
                left = len(inflight)
                if left <= self.low_water:
                    self._room.set()
                if left == 0:
                    self._done.set()

    def _on_ack(self, token: str, data: bytes, headers: bytes | None) -> None:
        retryable = not data and self._retry_503 and token in self._inflight and _status_of(headers) == 503
        if retryable and self._schedule_retry(token):
            return
        sent = self._inflight.pop(token, None)
        if sent is None:
            return  # a late or repeated reply for a frame already settled
        self._first_503.pop(token, None)
        self._last_progress = time.monotonic()
        dead_letter = token.startswith(DEAD_LETTER_TAG)
        if not data:
            status = _status_of(headers)
            description = (
                "no stream captures this subject (no responders)" if status == 503 else f"status {status}"
            )
            if status == 503 and self._retry_503:
                description = f"no stream leader answered for {self._ack_timeout:g}s (no responders)"
            self._fail(token, sent, status, None, description, dead_letter)
        else:
            ack = parse_puback(data)  # decided on its keys: stream and domain names are free text
            if ack.outcome == ERROR:
                self._fail(token, sent, ack.code, ack.err_code, ack.description, dead_letter)
            elif dead_letter:
                self.dead_lettered += 1
            elif ack.outcome == DUPLICATE:
                self.duplicates += 1
            else:
                self.stored += 1
        inflight = len(self._inflight)
        if inflight <= self.low_water:
            self._room.set()
        if inflight == 0:
            self._done.set()

    def _on_ordered_ack(self, token: str, data: bytes, headers: bytes | None) -> None:
        """An ordered publisher's reply: stored acks are remembered with their sequence (a recovery may
        move them); one that overtakes an older frame, and any 503, start a recovery.

        When nothing goes wrong the PubAck is the oldest frame's in flight, no recovery runs and nothing
        is remembered: the frame is stored in its place, and :meth:`_forget_settled` would drop its entry
        as soon as it was made. Then only the highest sequence is kept (for :meth:`_find_stored`'s floor);
        the entry is made only once order is in doubt (a frame overtaken, a recovery under way, or frames
        remembered already), so the repair sees every entry it saw before."""
        if not data and _status_of(headers) == 503 and token in self._inflight:
            self._trouble()  # still unanswered, in its place: the recovery sends it again
            return
        pending = self._pending
        send_no = pending.pop(token, None)
        sent = self._inflight.get(token)
        calm = self._calm()
        if sent is not None and send_no is not None and data and not token.startswith(DEAD_LETTER_TAG):
            overtook = bool(pending) and next(iter(pending.values())) < send_no  # an older frame was dropped
            found = _ACK_SEQ.search(data)
            if found is not None and b'"error"' not in data:  # stored, or a duplicate: its seq is the original's
                seq = int(found.group(1))
                if overtook or self._stored_recent or not calm:
                    self._remember_stored(token, send_no, sent, seq)
                elif seq > self._max_seq:
                    self._max_seq = seq  # all _remember_stored keeps of a frame it would forget at once
            if overtook:
                self._trouble()
                calm = False
            if may_be_plain(data):  # the common case, settled here as the unordered fast path does
                del self._inflight[token]
                self.stored += 1
                self._last_progress = time.monotonic()
                left = len(self._inflight)
                if left <= self.low_water:
                    self._room.set()
                if left == 0:
                    self._done.set()
                if calm:
                    self._forget_settled()
                return
        self._on_ack(token, data, headers)
        if calm and self._calm():
            self._forget_settled()

    def _calm(self) -> bool:
        """No ordered recovery is under way."""
        return self._recovery is None or self._recovery.done()

    def _in_order(self) -> bool:
        """Nothing puts the order in doubt: no recovery under way, no stored frame remembered (one is
        remembered only while it was sent after a frame still unanswered)."""
        return not self._stored_recent and (self._recovery is None or self._recovery.done())

    def _remember_stored(self, token: str, send_no: int, sent: tuple, seq: int) -> None:
        """A frame the stream holds at ``seq``: kept (newest last) until no recovery can need to move it."""
        if seq > self._max_seq:
            self._max_seq = seq
        self._stored_recent.pop(token, None)
        self._stored_recent[token] = (send_no, sent[0], sent[2], seq, sent)

    def _forget_settled(self) -> None:
        """Stored frames sent before every unanswered one can never need moving, nor their send's floor
        (``_find_stored``) be needed: forget them (memory stays bounded by the frames in flight).

        Only between recoveries: then every frame stored is in its subject's order (the last recovery
        ended calm, and a PubAck that overtakes an older frame starts a new one). Within a recovery, frames
        stored ahead of an earlier one of their subject may not have been checked yet (:func:`.reorder.ahead`
        runs once nothing is unanswered): forgetting them there, behind a resend still unanswered, lost
        their order silently (issue #39)."""
        oldest = next(iter(self._pending.values()), None)
        floors = self._floors
        if oldest is None:
            floors.clear()
        else:
            while len(floors) > 1 and floors[1][0] <= oldest:
                floors.popleft()
        recent = self._stored_recent
        while recent:
            token, entry = next(iter(recent.items()))
            if oldest is not None and entry[0] >= oldest:
                break
            del recent[token]

    def _trouble(self) -> None:
        self._may_send.clear()
        if self._recovery is None or self._recovery.done():
            self._again = False
            self._recovery = self._track(self._recover_until_calm())
        else:
            self._again = True  # seen while a round runs: another round follows it

    async def _recover_until_calm(self) -> None:
        while True:
            await self._recover()
            if not self._again:
                self._may_send.set()
                return
            self._again = False

    async def _recover(self) -> None:
        """Module docstring: wait until every frame in flight is answered or quiet; send the unanswered
        ones again, in the task's order; once they are answered, move the frames stored ahead of an
        earlier one of their subject (deleted, sent again under a new id); until all is calm."""
        from . import reorder

        while True:
            await self._quiet()
            for token in [t for t in self._pending if t not in self._inflight]:
                del self._pending[token]  # settled another way (a refusal the server sent as -ERR)
            unanswered = sorted((t for t in self._pending if t in self._inflight), key=lambda t: self._inflight[t][0])
            if unanswered:
                unanswered = await self._find_stored(unanswered)
            stored = [reorder.Stored(t, e[1], e[2], e[3]) for t, e in self._stored_recent.items()]
            if unanswered:
                self._rounds += 1
                # A compare-and-set frame goes out only in its subject's order (reorder.in_place).
                now, first = reorder.in_place((reorder.Unanswered(t, self._inflight[t][0], self._inflight[t][2],
                                                                  _conditional(self._inflight[t]))
                                               for t in unanswered), stored)
                again, first_sends = await self._move(first)
                now = sorted(now + again, key=lambda t: self._inflight[t][0])
                await self._send_again(now, first_sends)
                continue  # their answers, then the order check
            moved = reorder.ahead(stored)
            if not moved:
                return
            self._rounds += 1
            again, first_sends = await self._move(moved)
            if not again:
                return
            await self._send_again(again, first_sends)

    async def _move(self, frames: list) -> tuple[list[str], dict[str, int]]:
        """Delete the stored copies of ``frames`` (:class:`.reorder.Stored`) and make them ready to send again
        under a new id: (their tokens, their first send numbers). A copy the stream will not delete stays."""
        again, first_sends = [], {}
        for frame in frames:
            entry = self._stored_recent.pop(frame.token)
            deleted = await self._delete(frame.seq)
            if not deleted and not self._bucket:
                self.left_out_of_order += 1  # the stream keeps it where it is: counted, never stored twice
                continue
            self.stored -= 1
            self.reordered += 1
            self._inflight[frame.token] = self._renamed(entry[4])
            again.append(frame.token)
            first_sends[frame.token] = entry[0]
        return again, first_sends

    async def _find_stored(self, tokens: list[str]) -> list[str]:
        """Which of the unanswered frames ``tokens`` the stream holds after all (stored, and the PubAck lost
        with the leader): settled as if their PubAck had come, with the sequence the stream gave them.
        Sending them again is not enough: a leader election can outlast the stream's duplicate window (a
        short one, or a slow election), and then the server stores the frame a second time (the chaos
        soak's cluster phase: 418 rows stored twice). Returns the frames still to send. One headers-only
        read of the stream after the highest sequence acked before the oldest of them was sent."""
        from ..records.replay_guard import stored_sequences

        oldest = min(self._pending[t] for t in tokens)  # their first sends: a resend keeps the number
        floor = max((seq for first, seq in self._floors if first <= oldest), default=0)
        wanted = {self._inflight[t][4]: t for t in tokens if self._inflight[t][4]}
        if not wanted:
            return tokens
        found = await stored_sequences(self._nc, self._stream, self._api_prefix, floor, set(wanted),
                                       deadline=self._ack_timeout)
        for msg_id, seq in found.items():
            token = wanted[msg_id]
            self._remember_stored(token, self._pending.pop(token), self._inflight.pop(token), seq)
            self.stored += 1
            self.found_after_loss += 1
        if found:
            self._last_progress = time.monotonic()
            if not self._inflight:
                self._done.set()
            if len(self._inflight) <= self.low_water:
                self._room.set()
        return [t for t in tokens if t in self._inflight]

    async def _quiet(self) -> None:
        """Until every frame in flight is answered, or no answer came for :data:`QUIET` seconds."""
        started = time.monotonic()
        while self._pending and time.monotonic() - self._last_reply < QUIET:
            if time.monotonic() - started > self._ack_timeout:
                return
            await asyncio.sleep(QUIET / 5)

    async def _send_again(self, tokens: list[str], first_sends: dict[str, int] | None = None) -> None:
        """Send ``tokens`` again, in this order. Unanswered ones keep their place among the pending;
        ``first_sends`` numbers the others (moved frames: their PubAck had come)."""
        if first_sends:
            self._pending.update(first_sends)
            self._pending = collections.OrderedDict(sorted(self._pending.items(), key=lambda item: item[1]))
        self._done.clear()
        self.resent += len(tokens)
        self._last_reply = time.monotonic()
        await self._send(b"".join(self._inflight[t][1] for t in tokens))  # progress is a PubAck, not a resend

    def moved_copy(self, sent: tuple) -> tuple:
        """``sent`` (OutFrame layout) under this attempt's own moved id (``:o<move_base>``): a retried attempt
        publishes it behind a row its predecessor left missing, then deletes the copy stored ahead
        (:meth:`delete_stored`, :mod:`.retry_order`)."""
        return self._renamed(sent, self._move_base)

    async def delete_stored(self, seqs: list[int]) -> int:
        """Delete the messages at ``seqs`` of the target (no erase), asked again while it has no leader; how
        many it would not delete (``deny_delete``)."""
        refused = 0
        for i in range(0, len(seqs), 256):  # a few hundred requests at a time
            kept = await asyncio.gather(*(self._delete(seq) for seq in seqs[i:i + 256]))
            refused += sum(1 for deleted in kept if not deleted)
        return refused

    async def _delete(self, seq: int) -> bool:
        from ...client import jsapi
        from ...errors import JetStreamApiError

        for attempt in range(20):
            try:
                await jsapi.request(self._nc, f"STREAM.MSG.DELETE.{self._stream}", {"seq": seq, "no_erase": True},
                                    prefix=self._api_prefix)
                return True
            except JetStreamApiError as exc:
                if not jsapi.is_transient(exc):
                    # Denied (deny_delete), or gone already: a delete whose reply was lost did happen.
                    still = await jsapi.next_message(self._nc, self._stream, seq, prefix=self._api_prefix)
                    return still is None or still.seq != seq
                await asyncio.sleep(min(0.1 * (attempt + 1), 1.0))  # a leader being elected: ask again
        raise JetStreamConnectorError(f"Could not delete message {seq} of stream '{self._stream}' to put it back in "
                                      "its subject's order after a leader change: the stream answered no delete.")

    def _renamed(self, sent: tuple, number: int | None = None) -> tuple:
        """``sent`` under a new id (:func:`~.reorder.moved_id`, numbered ``number``, else by this round): its
        stored copy was deleted (or is to be), and the server would take the old id for a duplicate."""
        from ...protocol.frames import hpub_frame, parse_hpub_frame
        from . import reorder

        position, frame, subject, ttl, msg_id, _, payload_len = sent[:7]
        _, block, payload = parse_hpub_frame(frame)
        new_id = reorder.moved_id(msg_id, self._move_base + self._rounds if number is None else number)
        block = block.replace(f"Nats-Msg-Id: {msg_id}\r\n".encode(), f"Nats-Msg-Id: {new_id}\r\n".encode(), 1)
        new_frame = hpub_frame(subject, f"{self.reply_prefix}{position}", block, payload)
        return (position, new_frame, subject, ttl, new_id, len(block), payload_len, *sent[7:])

    def _schedule_retry(self, token: str) -> bool:
        """Queue ``token`` for a resend unless its 503s have lasted ``ackTimeout``."""
        now = time.monotonic()
        first = self._first_503.setdefault(token, now)
        if now - first >= self._ack_timeout:
            return False
        self._retry_due.add(token)
        if self._retry_task is None or self._retry_task.done():
            self._retry_task = self._track(self._resend_later())
        return True

    async def _resend_later(self) -> None:
        await asyncio.sleep(RETRY_503_INTERVAL)
        due, self._retry_due = self._retry_due, set()
        await self._resend([token for token in due if token in self._inflight])

    async def _send(self, buffer: bytes) -> None:
        """Hand ``buffer`` to the connection, remembering it until nats-py has written it (see :meth:`abort`)."""
        from ...client.nats_internals import send_raw, still_pending

        self._unwritten = still_pending(self._nc, self._unwritten)
        self._unwritten.append(buffer)
        await send_raw(self._nc, buffer)

    async def _resend(self, tokens: list[str]) -> None:
        if not tokens or self._nc.is_closed:
            return
        self.resent += len(tokens)
        await self._send(b"".join(self._inflight[token][1] for token in tokens))

    def on_reconnected(self) -> None:
        if self._ordered and self._pending:
            self._trouble()
        elif self._idempotent and self._inflight:
            self._track(self._resend(list(self._inflight)))

    def on_closed(self, cause: str) -> None:
        """The connection is gone for good: no PubAck can arrive; wake every waiter now."""
        self._closed = cause
        self._room.set()
        self._done.set()

    def _closed_error(self) -> JetStreamConnectorError:
        return JetStreamConnectorError(
            f"The NATS connection was closed while {len(self._inflight)} publishes awaited their PubAck: "
            f"{self._closed}. The task fails so that Spark retries it on a new connection."
        )

    def on_permission_error(self, violation) -> None:
        """The server refused a publish (async -ERR, no PubAck will come): fail the frames it names
        (a :class:`~pyspark_jetstream.client.nats_internals.PermissionViolation`: subjects are
        case-sensitive, ``Orders.x`` is not ``orders.x``)."""
        inbox_refused = violation.names(f"{self.reply_prefix}*")  # no PubAck could ever arrive
        for token, sent in list(self._inflight.items()):
            if inbox_refused or violation.names(sent[2]):
                del self._inflight[token]
                self._fail(token, sent, 403, None, violation.text, token.startswith(DEAD_LETTER_TAG))
        self._last_progress = time.monotonic()
        if len(self._inflight) <= self.low_water:
            self._room.set()
        if not self._inflight:
            self._done.set()

    def _fail(self, token: str, sent: tuple, code: int, err_code, description: str, dead_letter: bool) -> None:
        self._first_503.pop(token, None)
        position = int(token[1:] if dead_letter else token)
        self.failures.append(AckFailure(position, sent, code, err_code, description, dead_letter))

    def _track(self, coro) -> asyncio.Task:
        """Run a background send, keeping it referenced; a failure is raised by the next wait."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None and self._send_error is None:
                self._send_error = t.exception()
                self._room.set()
                self._done.set()

        task.add_done_callback(done)
        return task

    async def _wait(self, event: asyncio.Event, what: str) -> None:
        while not event.is_set() or self._closed is not None or self._send_error is not None:
            if self._closed is not None:
                raise self._closed_error()
            if self._send_error is not None:
                raise JetStreamConnectorError(
                    f"Publishing failed in the background ({type(self._send_error).__name__}: {self._send_error}) "
                    f"while {len(self._inflight)} publishes awaited their PubAck; the task fails so that Spark "
                    "retries it.")
            try:
                await asyncio.wait_for(event.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                now = time.monotonic()
                idle = now - self._last_progress
                if (self._idempotent and self._retry_503 and idle >= RESEND_AFTER_SILENCE
                        and now - self._last_resend >= RESEND_AFTER_SILENCE):
                    self._last_resend = now
                    if self._ordered:
                        self._trouble()
                    else:
                        await self._resend([token for token in self._inflight if token not in self._retry_due])
                if idle >= self._ack_timeout and not event.is_set():
                    first = min(self._inflight, key=lambda t: int(t.lstrip(DEAD_LETTER_TAG)), default="?")
                    raise AckTimeoutError(
                        f"No PubAck for {idle:.0f}s while {len(self._inflight)} publishes awaited one ({what}); "
                        f"the first is row {first.lstrip(DEAD_LETTER_TAG)}. The server may be down or overloaded; "
                        "raise the option 'ackTimeout' if it is only slow."
                    ) from None

    async def publish(self, frames: list[tuple], *, dead_letter: bool = False) -> None:
        """Hand ``frames`` (each in the :class:`~pyspark_jetstream.sink.encoder.OutFrame` layout:
        position, frame, subject, ...) to the connection, never exceeding the window of pending acks."""
        if self._nc.is_closed or self._closed is not None:
            self._closed = self._closed or "the connection was closed"
            raise self._closed_error()
        tag = DEAD_LETTER_TAG if dead_letter else ""
        inflight = self._inflight
        i, total = 0, len(frames)
        while i < total:
            if not self._may_send.is_set():  # an ordered recovery is under way: nothing new goes out
                self._last_progress = time.monotonic()
                await self._wait(self._may_send, "recovering the order after a leader change")
                continue
            room = self._max_pending - len(inflight)
            if room <= 0:
                self._room.clear()
                self._last_progress = time.monotonic()
                await self._wait(self._room, "window full")
                continue
            chunk = frames[i : i + room]
            i += len(chunk)
            if self._ordered and not dead_letter:  # dead letters go to another stream: their acks keep no order
                # Every frame of the chunk is stored after the highest sequence acked so far: where a
                # recovery looks for the ones whose PubAck was lost (_find_stored).
                first = self._send_no + 1
                self._floors.append((first, self._max_seq))
                self._send_no += len(chunk)
                pending = self._pending
                for send_no, sent in enumerate(chunk, first):
                    token = str(sent[0])  # no tag: not a dead letter
                    inflight[token] = sent
                    pending[token] = send_no
            else:
                for sent in chunk:
                    inflight[f"{tag}{sent[0]}"] = sent
            self._done.clear()
            await self._send(b"".join(sent[1] for sent in chunk))

    async def drain(self) -> None:
        """Wait until every published frame has its PubAck (or ``ackTimeout`` passes without progress),
        and an ordered recovery under way has ended: the PubAck that empties the window can come before
        its order check, which may move frames yet."""
        self._last_progress = time.monotonic()
        while True:
            if self._inflight:
                self._done.clear()
                await self._wait(self._done, "end of partition")
            elif not self._may_send.is_set():
                await self._wait(self._may_send, "recovering the order after a leader change")
            else:
                return

    async def abort(self) -> None:
        """Close after the task failed: frames nats-py still holds (the connection is down) are
        dropped, so that they are not published after the reconnect, behind the task's back."""
        from ...client.nats_internals import discard_pending

        if not self._nc.is_closed:
            discard_pending(self._nc, self._unwritten)
        self._unwritten = []
        await self.close()

    async def close(self) -> None:
        from ...client.nats_internals import events_of

        events_of(self._nc).listeners.discard(self)
        for task in list(self._tasks):
            task.cancel()
        if self._sub is not None:
            # The connection may already be gone; then there is nothing left to release.
            with contextlib.suppress(Exception):
                await raw_unsubscribe(self._nc, self._sub)
            self._sub = None

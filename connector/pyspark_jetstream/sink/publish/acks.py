"""PubAck handling: what each reply to a published frame means, settled as it arrives.

Every frame's reply subject is ``<inbox>.<position>`` (a dead letter's ``<inbox>.d<position>``), so
a reply names the row it answers without any per-message future. The replies one socket read
brought arrive together, straight from nats-py's parser (no ``Msg`` per reply); a plain "stored" ack
is settled in a loop that does nothing else, every other reply (an error, a duplicate, a dead
letter's, a 503 status) is read in full. A refusal becomes an :class:`AckFailure` for the task to
settle (dead letters, or a failure naming the row).

:class:`PubAcks` is one part of :class:`~pyspark_jetstream.sink.publish.publisher.Publisher` (it
holds the counters and the failures; the window, the resends and the ordered recovery it calls are
the publisher's and :class:`~pyspark_jetstream.sink.publish.recovery.OrderedRecovery`'s).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ...protocol.headers import parse_status
from ...protocol.puback import DUPLICATE, ERROR, may_be_plain, parse_puback

DEAD_LETTER_TAG = "d"
"""Reply-token prefix that marks a dead-letter publish (``<inbox>.d<position>``)."""

ACK_SEQ = re.compile(rb'"seq"\s*:\s*(\d+)')
"""The stream sequence in a PubAck's body, found without parsing the JSON."""


def status_of(headers: bytes | None) -> int:
    """The status code of an empty reply (``NATS/1.0 503`` when no stream took the message)."""
    return parse_status(headers)[0] if headers else 0


@dataclass(frozen=True)
class AckFailure:
    """A publish the server did not store; ``sent`` is what was handed to :meth:`Publisher.publish`
    for it (the :class:`~pyspark_jetstream.sink.encode.frames.OutFrame` layout)."""

    position: int
    sent: tuple
    code: int
    err_code: int | None
    description: str
    dead_letter: bool


class PubAcks:
    """The publisher's replies: settled, counted, or kept as failures (module docstring)."""

    def _init_acks(self) -> None:
        self.failures: list[AckFailure] = []
        self.stored = 0
        self.duplicates = 0
        self.dead_lettered = 0

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
                found = ACK_SEQ.search(last_in_order)
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
        retryable = not data and self._retry_503 and token in self._inflight and status_of(headers) == 503
        if retryable and self._schedule_retry(token):
            return
        sent = self._inflight.pop(token, None)
        if sent is None:
            return  # a late or repeated reply for a frame already settled
        self._first_503.pop(token, None)
        self._last_progress = time.monotonic()
        dead_letter = token.startswith(DEAD_LETTER_TAG)
        if not data:
            status = status_of(headers)
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

"""PubAck handling: what each reply to a published frame means, settled as it arrives.

Every frame's reply subject is ``<inbox>.<position>`` (a dead letter's ``<inbox>.d<position>``), so
a reply names the row it answers without any per-message future. The replies one socket read
brought arrive together, straight from nats-py's parser (no ``Msg`` per reply); a run of nothing but
plain "stored" acks is settled in a few C-level passes (:func:`settle_plain_run`), a plain ack among
others in a loop that does nothing else, every other reply (an error, a duplicate, a dead
letter's, a 503 status) is read in full. A refusal becomes an :class:`AckFailure` for the task to
settle (dead letters, or a failure naming the row).

:class:`AckTracker` is one part of :class:`~pyspark_jetstream.sink.publish.publisher.Publisher`
(``pub.acks``): it owns the counters and the failures. The window it settles frames in (the frames in
flight, its events, the 503 resends) is the publisher's; an ordered publisher's replies go to
:class:`~pyspark_jetstream.sink.publish.recovery.OrderedRecovery` (``pub.recovery``). What a run of
replies needs of them is bound to locals once per run, not looked up per reply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat

from ...protocol.headers import parse_status
from ...protocol.puback import DUPLICATE, ERROR, all_plain, id_in_process, may_be_plain, parse_puback
from .window import clock

DEAD_LETTER_TAG = "d"
"""Reply-token prefix that marks a dead-letter publish (``<inbox>.d<position>``)."""

ACK_SEQ = re.compile(rb'"seq"\s*:\s*(\d+)')
"""The stream sequence in a PubAck's body, found without parsing the JSON."""


def settle_plain_run(frames: list, cut: int, inflight: dict, first_503: dict) -> int | None:
    """Settle a run of replies (``(subject, reply, data, headers)``, reply subjects ``<inbox>.<token>``,
    ``cut`` the inbox's length) when every one is a plain "stored" ack of a row, not a dead letter's:
    each token's frame leaves ``inflight`` (and ``first_503``). Returns how many were in flight, or
    None, having settled nothing, when any reply must be read in full (the per-reply loop then takes
    the run). The same outcome as that loop for such a run, in a few C-level passes: the tokens are
    decoded in one piece (a subject holds no space) and popped by ``map``."""
    if not all_plain([frame[2] for frame in frames]):
        return None
    text = b" ".join([frame[0][cut:] for frame in frames]).decode()
    if DEAD_LETTER_TAG in text:
        return None
    tokens = text.split(" ")
    settled = list(map(inflight.pop, tokens, repeat(None)))
    if first_503:
        for token, sent in zip(tokens, settled, strict=True):
            if sent is not None:
                first_503.pop(token, None)
    return len(tokens) - settled.count(None)


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


class AckTracker:
    """The publisher's replies: settled, counted, or kept as failures (module docstring)."""

    def __init__(self, pub) -> None:
        self._pub = pub
        self.failures: list[AckFailure] = []
        self.stored = 0
        self.duplicates = 0
        self.dead_lettered = 0

    def on_frame(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Called by nats-py's parser for a PubAck it parsed itself: as one of a run."""
        self.on_frames(((subject, reply, data, headers),))

    def on_frames(self, frames: list) -> None:
        """The PubAcks one socket read brought, in order (nats_internals' fast frame path): must never
        raise into the read loop; a failure here fails the write (the next wait raises it) instead of
        losing the ack to a log line. A plain "stored" ack is settled here and the window's events are
        set once for the run; every other ack (an error, a duplicate, a dead letter's, a status) takes
        :meth:`on_ack`, in its place in the run.

        Ordered, a plain ack of the oldest frame in flight while order is not in doubt (no recovery, nothing
        remembered: :meth:`.recovery.OrderedRecovery.in_order`) is settled here too, with no bookkeeping: it is stored in its place,
        and :meth:`.recovery.OrderedRecovery.on_ordered_ack` would remember it only to forget it at once. The run's last such ack
        gives the highest sequence (PubAcks come in send order); the floors are pruned once per run.
        Anything else takes :meth:`.recovery.OrderedRecovery.on_ordered_ack`."""
        pub = self._pub
        inflight, first_503, cut = pub.window.inflight, pub.window.first_503, pub.window.prefix_len
        on_ack = self.on_ack
        stored = 0
        recovery = pub.recovery
        ordered = recovery.ordered
        last_in_order = None  # ordered: the body of the run's last ack settled in order
        if ordered:
            recovery.last_reply = clock()
            book = recovery.book
            pending = book.pending
            in_order = recovery.in_order()
            on_ordered_ack, still_in_order = recovery.on_ordered_ack, recovery.in_order
        try:
            if not ordered:
                settled = settle_plain_run(frames, cut, inflight, first_503)
                if settled is not None:
                    stored, frames = settled, ()
            for subject, _reply, data, headers in frames:
                token = subject[cut:].decode()
                if ordered:
                    if (in_order and data and may_be_plain(data) and pending and next(iter(pending)) == token
                            and inflight.pop(token, None) is not None):
                        pending.popitem(last=False)  # the oldest (a dead letter's token is never pending)
                        stored += 1
                        last_in_order = data
                        continue
                    on_ordered_ack(token, data, headers)
                    in_order = still_in_order()
                    continue
                # A cheap pre-check: an ack it cannot vouch for (a stream named 'error') is parsed.
                if data and may_be_plain(data) and not token.startswith(DEAD_LETTER_TAG):
                    if inflight.pop(token, None) is not None:
                        if first_503:
                            first_503.pop(token, None)
                        stored += 1
                    continue
                on_ack(token, data, headers)
        except Exception as exc:
            if pub.window.send_error is None:
                pub.window.send_error = exc
            pub.window.room.set()
            pub.window.done.set()
        finally:
            if last_in_order is not None:
                found = ACK_SEQ.search(last_in_order)
                if found is not None and int(found.group(1)) > book.max_seq:
                    book.max_seq = int(found.group(1))
                if recovery.calm():
                    book.forget_settled()
            if stored:
                self.stored += stored
                pub.window.eased()

    def on_ack(self, token: str, data: bytes, headers: bytes | None) -> None:
        """One reply read in full: settled, counted, scheduled for a resend (a 503 in a cluster) or failed."""
        pub = self._pub
        retryable = token in pub.window.inflight and (
            (not data and pub.window.retry_503 and status_of(headers) == 503)
            or (data and id_in_process(data)))  # its id's earlier copy is still proposed: ask again later
        if retryable and pub.schedule_retry(token):
            return
        sent = pub.window.inflight.pop(token, None)
        if sent is None:
            return  # a late or repeated reply for a frame already settled
        pub.window.first_503.pop(token, None)
        dead_letter = token.startswith(DEAD_LETTER_TAG)
        if not data:
            status = status_of(headers)
            description = (
                "no stream captures this subject (no responders)" if status == 503 else f"status {status}"
            )
            if status == 503 and pub.window.retry_503:
                description = f"no stream leader answered for {pub.window.ack_timeout:g}s (no responders)"
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
        pub.window.eased()

    def on_permission_error(self, violation) -> None:
        """The server refused a publish (async -ERR, no PubAck will come): fail the frames it names
        (a :class:`~pyspark_jetstream.client.nats_internals.PermissionViolation`: subjects are
        case-sensitive, ``Orders.x`` is not ``orders.x``)."""
        pub = self._pub
        inbox_refused = violation.names(f"{pub.reply_prefix}*")  # no PubAck could ever arrive
        for token, sent in list(pub.window.inflight.items()):
            if inbox_refused or violation.names(sent[2]):
                del pub.window.inflight[token]
                self._fail(token, sent, 403, None, violation.text, token.startswith(DEAD_LETTER_TAG))
        pub.window.eased()

    def _fail(self, token: str, sent: tuple, code: int, err_code, description: str, dead_letter: bool) -> None:
        self._pub.window.first_503.pop(token, None)
        if not dead_letter and self._pub.mover.keep_refused(token):
            self.stored += 1  # a moved copy refused: the row's old copy stands (moves.py), stored as it was
            return
        position = int(token[1:] if dead_letter else token)
        self.failures.append(AckFailure(position, sent, code, err_code, description, dead_letter))

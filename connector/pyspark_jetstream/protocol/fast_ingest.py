"""Fast-ingest batch publishing (ADR-50, nats-server 2.14.3+, stream ``allow_batched``), free of I/O.

A plain JetStream publish costs one PubAck per message: the stream's ingest routine writes it, the
client parses and settles it. A fast-ingest batch replaces those with a flow ack every ``M`` messages.
Everything the batch says travels in the reply subject of each message,
``<prefix>.<batch id>.<flow>.<fail|ok>.<k>.<op>.$FI``, and every answer comes back under
``<prefix>.<batch id>.>``:

- ``{"type":"ack","seq":S,"msgs":M}``: in ``fail`` mode, messages 1..S are stored (cumulative: a lost
  ack is implied by the next); the next ack comes M messages later. The first reply, to message 1, is
  ``seq 0``: the client must wait for it before sending more (the server picks M).
- ``{"type":"gap","last_seq":E,"seq":C}``: messages E..C-1 never arrived. In ``fail`` mode the batch
  ends: the final PubAck's ``count`` is the last contiguous message.
- ``{"type":"err","seq":k,"error":{...}}``: message k failed a header check (``Nats-TTL`` on a stream
  without TTLs, an expected-last-sequence mismatch). In ``fail`` mode the batch ends before k.
- the final PubAck ``{"stream","seq":<stream seq of the last message>,"batch","count"}``, or an error
  PubAck ``{"error":{...}}``: unknown batch 10208 (idle 10 s, an R1 restart), too many open batches
  429/10211, batching disabled 10205; a refusal of message 1 itself also comes this way.

This module is the ``fail`` mode only: the sink needs every message stored once, in order, and a
known point to resume from. ``Nats-Msg-Id`` is still checked per message (a duplicate is skipped but
counted), which is what makes resending from the last flow ack + 1 exactly-once.

Facts read from nats-server's sources (server/stream.go ``processJetStreamFastBatchMsg``,
server/jetstream_batching.go) and ADR-50; see docs/architecture.md, "Fast-ingest batches".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Union

from .headers import parse_status

SUFFIX = "$FI"
OP_START, OP_APPEND, OP_COMMIT, OP_COMMIT_EOB, OP_PING = 0, 1, 2, 3, 4
"""Batch operations: start (message 1 only), append, commit (stores the message and ends the batch),
commit without storing (end-of-batch: never used here, the last message commits), ping (stores
nothing; the server answers with its last flow ack, or a gap)."""
GAP_FAIL = "fail"
MAX_BATCH_ID = 64
MAX_FLOW = 65_535
"""The flow a client may ask for is a uint16 on the server; it answers with at most min(500, flow)."""
OUTSTANDING = 2
"""Flow acks a publisher may run ahead of: ADR-50's advice (while the server works on one window, the
next is on its way)."""

ERR_DISABLED, ERR_PATTERN, ERR_BATCH_ID, ERR_UNKNOWN, ERR_TOO_MANY = 10205, 10206, 10207, 10208, 10211
BATCH_ERRORS = frozenset((ERR_DISABLED, ERR_PATTERN, ERR_BATCH_ID, ERR_UNKNOWN, ERR_TOO_MANY, 10209))
"""Error codes about the batch, not about a message (10209: a mirror cannot take batches)."""

_TOKEN = re.compile(r"[^.*>\s]+")


def op_for(k: int, total: int) -> int:
    """The operation of message ``k`` of ``total``: the last commits (a one-message batch commits at
    once and gets a plain PubAck), the first starts, the others append."""
    if k == total:
        return OP_COMMIT
    return OP_START if k == 1 else OP_APPEND


@dataclass(frozen=True)
class BatchReplies:
    """The reply subjects of one batch. ``flow`` is the largest ack interval the client accepts; the
    server repeats none of this state, so every message carries it (a follower that missed message 1
    still learns the mode)."""

    prefix: str
    batch_id: str
    flow: int = 500

    def __post_init__(self) -> None:
        if not _TOKEN.fullmatch(self.batch_id) or len(self.batch_id) > MAX_BATCH_ID:
            raise ValueError(f"a batch id is one subject token of at most {MAX_BATCH_ID} characters: "
                             f"{self.batch_id!r}")
        if not 1 <= self.flow <= MAX_FLOW:
            raise ValueError(f"flow must be within 1..{MAX_FLOW}: {self.flow}")

    @property
    def head(self) -> str:
        """Everything before the batch sequence (a sender appends ``<k>.<op>.$FI``)."""
        return f"{self.prefix}.{self.batch_id}.{self.flow}.{GAP_FAIL}."

    @property
    def listen(self) -> str:
        """The subscription that receives every answer of the batch."""
        return f"{self.prefix}.{self.batch_id}.>"

    def subject(self, k: int, op: int) -> str:
        return f"{self.head}{k}.{op}.{SUFFIX}"

    def for_message(self, k: int, total: int) -> str:
        return self.subject(k, op_for(k, total))

    def ping(self, highest_sent: int) -> str:
        """A ping names the highest sequence sent, not a new one: a lost ping then never looks like a
        gap, and a message the server never got makes it answer with one."""
        return self.subject(highest_sent, OP_PING)


def split_reply_subject(subject: str, prefix: str) -> tuple[str, int] | None:
    """(batch id, k) of an answer's subject under ``prefix``: the server answers on the reply
    subject of the message concerned, so ``k`` names it. None for anything else."""
    if not subject.startswith(prefix + ".") or not subject.endswith("." + SUFFIX):
        return None
    tokens = subject[len(prefix) + 1:].split(".")
    if len(tokens) != 6 or not tokens[3].isdigit():
        return None
    return tokens[0], int(tokens[3])


@dataclass(frozen=True)
class FlowAck:
    """Messages 1..``seq`` are stored (``fail`` mode); the next ack comes ``msgs`` messages later."""

    seq: int
    msgs: int


@dataclass(frozen=True)
class FlowGap:
    """Messages ``expected``..``current - 1`` never reached the leader. Informational and possibly out
    of order with the acks: it never says what was stored; the final PubAck does."""

    expected: int
    current: int


@dataclass(frozen=True)
class ApiError:
    code: int
    err_code: int | None
    description: str

    @property
    def no_responders(self) -> bool:
        """A 503 status: no stream captures the subject, or (in a cluster) its leader is gone."""
        return self.code == 503 and self.err_code is None

    def __str__(self) -> str:
        code = f"{self.code}" + (f"/{self.err_code}" if self.err_code is not None else "")
        return f"{self.description} ({code})"


@dataclass(frozen=True)
class FlowErr:
    """Message ``seq`` was refused (a header check); in ``fail`` mode nothing after it is stored."""

    seq: int
    error: ApiError


@dataclass(frozen=True)
class BatchAck:
    """The final PubAck: messages 1..``count`` are stored (duplicates skipped but counted), the last
    at stream sequence ``seq`` (0 when every one was a duplicate). ``duplicate``: a one-message batch
    whose message was already stored."""

    stream: str
    seq: int
    count: int
    batch: str = ""
    duplicate: bool = False


@dataclass(frozen=True)
class BatchError:
    """An error PubAck, or a status (503 no responders) in answer to message ``at`` (``on_ping``: to a ping
    naming it, which says nothing of whether message ``at`` itself was stored)."""

    at: int
    error: ApiError
    on_ping: bool = False

    @property
    def unknown_batch(self) -> bool:
        return self.error.err_code == ERR_UNKNOWN

    @property
    def too_many(self) -> bool:
        """Too many open batches on the stream or the server: worth retrying later."""
        return self.error.err_code == ERR_TOO_MANY or (self.error.code == 429 and self.error.err_code is None)

    @property
    def no_responders(self) -> bool:
        return self.error.no_responders

    @property
    def about_batch(self) -> bool:
        """About the batch, not about message ``at`` (the stream cannot take it, or it is gone)."""
        return self.error.err_code in BATCH_ERRORS or self.too_many or self.no_responders


Reply = Union[FlowAck, FlowGap, FlowErr, BatchAck, BatchError]


def _api_error(error: object) -> ApiError:
    if not isinstance(error, dict):
        return ApiError(0, None, f"error: {str(error)[:200]}")
    err_code = error.get("err_code")
    try:
        code = int(error.get("code") or 0)
    except (TypeError, ValueError):
        code = 0
    return ApiError(code, err_code if isinstance(err_code, int) else None, str(error.get("description") or ""))


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(value)
    return value


def parse_reply(data: bytes, headers: bytes | None = None, at: int = 0, ping: bool = False) -> Reply:
    """What one answer of a batch says, decided on its keys (stream names are free text). ``at``: the
    batch sequence its subject names; ``ping``: the subject is a ping's. Anything unreadable is an error,
    never a silent success."""
    if not data:
        status, description = parse_status(headers) if headers else (0, "")
        if status == 503:
            description = "no stream captures the subject, or its leader is gone (no responders)"
        return BatchError(at, ApiError(status, None, description or f"an empty reply (status {status})"), ping)
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        return BatchError(at, ApiError(0, None, f"not a batch reply: {data[:200]!r}"))
    kind = reply.get("type")
    try:
        if kind == "ack":
            return FlowAck(_int(reply["seq"]), max(1, _int(reply["msgs"])))
        if kind == "gap":
            return FlowGap(_int(reply["last_seq"]), _int(reply["seq"]))
        if kind == "err":
            return FlowErr(_int(reply["seq"]), _api_error(reply.get("error")))
        if "error" in reply:
            return BatchError(at, _api_error(reply["error"]))
        if kind is None and "stream" in reply:
            return BatchAck(str(reply["stream"]), _int(reply.get("seq", 0)), _int(reply.get("count", 0)),
                            str(reply.get("batch") or ""), reply.get("duplicate") is True)
    except (KeyError, ValueError):
        pass
    return BatchError(at, ApiError(0, None, f"not a batch reply: {data[:200]!r}"))


DONE, RESUME, RETRY, REFUSED, FATAL = "done", "resume", "retry", "refused", "fatal"


@dataclass(frozen=True)
class BatchEnd:
    """How a batch ended, and what a publisher does next.

    - ``done``: messages 1..total are stored.
    - ``resume``: 1..``stored`` are stored; send ``resume_from``.. again in a new batch (a gap ended
      the batch, or it is unknown to the server now). The ``in_doubt`` messages after ``stored`` were
      sent without a word back: resending them is exactly-once only with their ``Nats-Msg-Id``.
    - ``retry``: nothing was taken (too many open batches, or no stream leader): start again later.
    - ``refused``: the server refused message ``refused`` (``error``); 1..``stored`` are stored
      (``in_doubt`` more may be), nothing after it is.
    - ``fatal``: the stream cannot take fast batches (``error``).
    """

    kind: str
    stored: int
    resume_from: int = 0
    in_doubt: int = 0
    refused: int = 0
    error: ApiError | None = None
    stream_seq: int = 0


@dataclass(frozen=True)
class FlowWindow:
    """The flow-control state of one ``fail``-mode batch of ``total`` messages, moved by what is sent
    and what comes back; every transition returns a new window.

    ``acked`` only grows: flow acks are cumulative, so a lost one is implied by the next, and a
    re-sent one (a new stream leader's first word, a ping's answer) moves nothing (``repeats``). A gap
    or a refusal stops the sending at once (``stopped``); the batch is over only with the final PubAck
    or an error that ends it (``final``), and :meth:`end` says where to go from there.
    """

    total: int
    outstanding: int = OUTSTANDING
    sent: int = 0
    acked: int = 0
    every: int = 0
    gap: FlowGap | None = None
    refusal: FlowErr | None = None
    final: BatchAck | BatchError | None = None
    repeats: int = 0

    @property
    def stopped(self) -> bool:
        return self.final is not None or self.gap is not None or self.refusal is not None

    def limit(self) -> int:
        """The highest batch sequence that may be sent now. Message 1 goes alone: the server's first
        answer says whether the stream takes the batch and how often it will ack (ADR-50: a client
        must not blast a server that already has many fast publishers). Then the window is
        ``outstanding`` flow intervals past the last ack."""
        if self.stopped:
            return self.sent
        if self.every == 0:
            return min(1, self.total)
        return max(self.sent, min(self.total, self.acked + self.every * self.outstanding))

    def sending(self, upto: int) -> FlowWindow:
        if not self.sent <= upto <= self.limit():
            raise ValueError(f"sending up to {upto}: the window allows {self.sent}..{self.limit()}")
        return replace(self, sent=upto)

    def on_reply(self, reply: Reply) -> FlowWindow:
        if self.final is not None:
            return self  # the batch is over: later answers (10208 for messages in flight) say nothing new
        if isinstance(reply, FlowAck):
            seq = min(reply.seq, self.sent)
            if seq > self.acked:
                return replace(self, acked=seq, every=reply.msgs)
            if self.every == 0:  # the first answer, to message 1: seq 0 and the server's interval
                return replace(self, every=reply.msgs)
            return replace(self, every=reply.msgs, repeats=self.repeats + 1)
        if isinstance(reply, FlowGap):
            return self if self.gap is not None else replace(self, gap=reply)
        if isinstance(reply, FlowErr):
            return self if self.refusal is not None else replace(self, refusal=reply)
        if isinstance(reply, BatchError) and reply.at > 1 and not reply.about_batch:
            # A check before the batch's own (a size limit, a sealed stream) refused message k: the
            # batch goes on without it, so the next message makes a gap and the PubAck comes then.
            if self.refusal is not None:
                return self
            return replace(self, refusal=FlowErr(reply.at, reply.error))
        return replace(self, final=reply)

    def end(self) -> BatchEnd:
        """What the final answer means (only once :attr:`final` is set)."""
        final = self.final
        if final is None:
            raise ValueError("the batch has not ended")
        if isinstance(final, BatchAck):
            stored = min(final.count, self.total)
            if self.refusal is not None and self.refusal.seq > stored:
                return BatchEnd(REFUSED, stored, refused=self.refusal.seq, error=self.refusal.error,
                                stream_seq=final.seq)
            if stored >= self.total:
                return BatchEnd(DONE, self.total, stream_seq=final.seq)
            return BatchEnd(RESUME, stored, resume_from=stored + 1, stream_seq=final.seq)
        doubt = self.sent - self.acked
        if self.refusal is not None:  # the PubAck that would have settled the refusal never came
            return BatchEnd(REFUSED, self.acked, in_doubt=max(0, self.refusal.seq - 1 - self.acked),
                            refused=self.refusal.seq, error=self.refusal.error)
        if final.unknown_batch or (final.no_responders and (final.at > 1 or final.on_ping)):
            # A 503 to a ping says nothing of message 1: a leader that stored it may have gone since.
            return BatchEnd(RESUME, self.acked, resume_from=self.acked + 1, in_doubt=doubt, error=final.error)
        if final.too_many or final.no_responders:  # message 1, alone, was not taken: nothing is in doubt
            return BatchEnd(RETRY, self.acked, resume_from=self.acked + 1, error=final.error)
        if final.about_batch:
            return BatchEnd(FATAL, self.acked, in_doubt=doubt, error=final.error)
        return BatchEnd(REFUSED, self.acked, in_doubt=max(0, final.at - 1 - self.acked), refused=final.at,
                        error=final.error)

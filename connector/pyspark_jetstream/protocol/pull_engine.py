"""ADR-37 ``consume()`` bookkeeping as a sans-I/O state machine.

The engine owns the buffer options, the pending messages/bytes counters, the
threshold that triggers the next pull request, the status table and the
heartbeat clock. It never touches a socket: the partition reader feeds it
events (a pull was sent, a message of this size arrived, a status arrived with
these headers, time passed, the connection dropped or came back) and asks it
what to do (send this pull request? give up?). Read it side by side with
ADR-37 "Consume specification" and nats.go ``jetstream/pull.go``.

Three types, never one bag (as in nats.go): :class:`ConsumeConfig` is the
user's options, :class:`PullRequest` the wire request (fields named as the
server names them), and the engine's counters the runtime state.

One addition for bounded reads: ``range_left`` caps every request so the engine
never asks for more messages than the partition's sequence range can hold.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass

BYTES_MODE_BATCH = 1_000_000
"""ADR-37: with max_bytes, send a large batch (a zero batch makes the server deliver one message)."""

DEFAULT_MAX_MESSAGES = 10_000
_NS = 1_000_000_000


class InvalidConsumeConfig(ValueError):
    """A ``consume.*`` rule broken: ``option`` names the option to change, the text says the rule."""

    def __init__(self, option: str, rule: str) -> None:
        super().__init__(f"{option} {rule}")
        self.option = option


@dataclass(frozen=True)
class ConsumeConfig:
    """The ``consume.*`` options, defaults and cross rules already applied.

    Exactly one of ``max_messages`` / ``max_bytes`` is the buffer limit; in bytes
    mode ``max_messages`` is :data:`BYTES_MODE_BATCH`.
    """

    max_messages: int
    max_bytes: int  # 0 when not in bytes mode
    threshold_messages: int
    threshold_bytes: int
    expires: float  # seconds
    idle_heartbeat: float  # seconds

    @property
    def bytes_mode(self) -> bool:
        return self.max_bytes > 0

    @classmethod
    def build(
        cls,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        threshold_messages: int | None = None,
        threshold_bytes: int | None = None,
        expires: float = 30.0,
        idle_heartbeat: float | None = None,
    ) -> ConsumeConfig:
        """ADR-37 "Defaults and constraints"; raises :class:`InvalidConsumeConfig` naming the option and rule."""
        if max_messages is not None and max_bytes is not None:
            raise InvalidConsumeConfig("consume.maxMessages", "and consume.maxBytes are exclusive")
        if expires < 1.0:
            raise InvalidConsumeConfig("consume.expires", "must be at least 1s")
        if idle_heartbeat is None:
            idle_heartbeat = min(expires / 2, 30.0)
        if not 0.5 <= idle_heartbeat <= 30.0:
            raise InvalidConsumeConfig("consume.idleHeartbeat", "must be between 500ms and 30s")
        if idle_heartbeat > expires / 2:
            raise InvalidConsumeConfig("consume.idleHeartbeat", "must be at most half of consume.expires")
        if max_bytes is not None:
            if max_bytes < 1:
                raise InvalidConsumeConfig("consume.maxBytes", "must be at least 1")
            tb = math.ceil(max_bytes / 2) if threshold_bytes is None else threshold_bytes
            if not 0 <= tb <= max_bytes:
                raise InvalidConsumeConfig("consume.thresholdBytes", "must be between 0 and consume.maxBytes")
            return cls(BYTES_MODE_BATCH, max_bytes, math.ceil(BYTES_MODE_BATCH / 2), tb, expires, idle_heartbeat)
        if threshold_bytes is not None:
            raise InvalidConsumeConfig("consume.thresholdBytes", "needs consume.maxBytes")
        mm = DEFAULT_MAX_MESSAGES if max_messages is None else max_messages
        if mm < 1:
            raise InvalidConsumeConfig("consume.maxMessages", "must be at least 1")
        tm = math.ceil(mm / 2) if threshold_messages is None else threshold_messages
        if not 0 <= tm <= mm:
            raise InvalidConsumeConfig("consume.thresholdMessages", "must be between 0 and consume.maxMessages")
        return cls(mm, 0, tm, 0, expires, idle_heartbeat)


@dataclass(frozen=True)
class PullRequest:
    """The body of ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` (server field names)."""

    batch: int
    max_bytes: int
    expires: int  # ns
    idle_heartbeat: int  # ns

    def to_json(self) -> bytes:
        body = {"batch": self.batch, "expires": self.expires, "idle_heartbeat": self.idle_heartbeat}
        if self.max_bytes:
            body["max_bytes"] = self.max_bytes
        return json.dumps(body, separators=(",", ":")).encode()


class Outcome(enum.Enum):
    """What a status means for the consume loop (ADR-37 "Status handling"): the engine decides,
    the partition reader only carries it out."""

    HEARTBEAT = "heartbeat"  # 100: only proves liveness
    IGNORE = "ignore"  # not telegraphed: the pull ended normally
    WARN = "warn"  # telegraphed, consume goes on
    REPULL = "re-pull"  # telegraphed, and the pending counts start over: the next pull refills in full
    RECREATE = "recreate"  # the consumer is gone: create it again from the last delivered sequence + 1
    FAIL = "fail"  # the request or the consumer is wrong for this loop: end the partition with the status
    TOO_LARGE = "too large"  # the next message exceeds a whole max_bytes budget: no pull can ever fetch it


@dataclass(frozen=True)
class StatusVerdict:
    outcome: Outcome
    code: int
    description: str


# ADR-37 status codes and the description fragments that tell them apart (matched lower-cased,
# as prefixes: servers append details such as "Exceeded MaxRequestBatch of 5").
STATUS_HEARTBEAT = 100
STATUS_BAD_REQUEST = 400
STATUS_NOT_FOUND = 404  # No Messages
STATUS_TIMEOUT = 408  # Request Timeout, Interest Expired (rev 3), Requests Pending
STATUS_CONFLICT = 409
STATUS_PIN_MISMATCH = 423  # rev 3: Nats-Wrong-Pin-Id
STATUS_NO_RESPONDERS = 503  # nobody answered the pull: the consumer does not exist

REQUEST_TIMEOUT = "request timeout"
MAX_BYTES_REACHED = "message size exceeds maxbytes"
BATCH_COMPLETED = "batch completed"
CONSUMER_DELETED = "consumer deleted"
CONSUMER_PUSH_BASED = "consumer is push based"
LEADERSHIP_CHANGE = "leadership change"


def classify_status(code: int, description: str) -> Outcome:
    """ADR-37's status table (rev 2, plus rev 3's 408 Interest Expired and 423 Nats-Wrong-Pin-Id)."""
    d = description.strip().lower()
    if code == STATUS_HEARTBEAT:
        return Outcome.HEARTBEAT
    if code == STATUS_NOT_FOUND:
        return Outcome.IGNORE
    if code == STATUS_TIMEOUT:
        return Outcome.IGNORE if d.startswith(REQUEST_TIMEOUT) else Outcome.WARN
    if code == STATUS_CONFLICT:
        if d.startswith((MAX_BYTES_REACHED, BATCH_COMPLETED)):
            return Outcome.IGNORE
        if d.startswith(CONSUMER_DELETED):
            return Outcome.RECREATE
        if d.startswith(CONSUMER_PUSH_BASED):
            return Outcome.FAIL
        if d.startswith(LEADERSHIP_CHANGE):
            return Outcome.REPULL  # nats.go: forces a full re-pull
        return Outcome.WARN  # Exceeded MaxRequest*, MaxWaiting, Server Shutdown
    if code == STATUS_PIN_MISMATCH:
        return Outcome.REPULL
    if code == STATUS_BAD_REQUEST:
        return Outcome.FAIL
    if code == STATUS_NO_RESPONDERS:
        return Outcome.RECREATE
    return Outcome.WARN


class PullEngine:
    """Pending-count bookkeeping for one consume loop over a bounded range."""

    def __init__(self, config: ConsumeConfig, *, range_left: int | None = None, now: float = 0.0) -> None:
        self.config = config
        self.pending_msgs = 0
        self.pending_bytes = 0
        self.range_left = range_left  # upper bound of messages still wanted; None = unbounded
        self.delivered = 0
        self.paused = False
        self.last_activity = now
        self.heartbeats_missed = 0

    # ---------------------------------------------------------------- pulls

    def next_pull(self) -> PullRequest | None:
        """ADR-37 steps 1-2: the request that refills the buffer, or None if none is due.

        Due when pending messages (or, in bytes mode, bytes) fell below the threshold.
        The caller sends it and then calls :meth:`on_pull_sent`.
        """
        cfg = self.config
        if self.paused:
            return None
        below = self.pending_msgs < cfg.threshold_messages or self.pending_msgs <= 0
        if cfg.bytes_mode:
            below = below or self.pending_bytes < cfg.threshold_bytes
        if not below:
            return None
        batch = cfg.max_messages - self.pending_msgs
        if self.range_left is not None:
            batch = min(batch, self.range_left - self.pending_msgs)
        if batch < 1:
            return None
        max_bytes = 0
        if cfg.bytes_mode:
            max_bytes = cfg.max_bytes - self.pending_bytes
            if max_bytes < 1:
                return None
        return PullRequest(batch, max_bytes, int(cfg.expires * _NS), int(cfg.idle_heartbeat * _NS))

    def on_pull_sent(self, request: PullRequest) -> None:
        """ADR-37: add the request's batch and max_bytes to the pending counts."""
        self.pending_msgs += request.batch
        self.pending_bytes += request.max_bytes

    # ---------------------------------------------------------------- arrivals

    def on_message(self, size: int, stream_seq_advance: int = 1, now: float | None = None) -> None:
        """A user message: 1 message and its server-computed size off the pending counts.

        ``stream_seq_advance`` (this seq minus the previous one) shrinks the range
        left, so deleted or filtered-out sequences are not asked for again.
        """
        self.on_messages(1, size, stream_seq_advance, now)

    def on_messages(self, count: int, size: int, stream_seq_advance: int, now: float | None = None) -> None:
        """``count`` user messages at once, ``size`` and ``stream_seq_advance`` their sums: the same state
        as ``count`` calls of :meth:`on_message` (a clamped subtraction of each is the clamped
        subtraction of their sum), for a reader that accounts once per socket read."""
        if count <= 0:
            return
        self.pending_msgs = max(self.pending_msgs - count, 0)
        if self.config.bytes_mode:
            self.pending_bytes = max(self.pending_bytes - size, 0)
        if self.range_left is not None:
            self.range_left = max(self.range_left - stream_seq_advance, 0)
        self.delivered += count
        self._activity(now)

    def on_status(self, code: int, description: str, pending_msgs: int | None = None,
                  pending_bytes: int | None = None, now: float | None = None) -> StatusVerdict:
        """ADR-37 steps 5-8: classify, and subtract Nats-Pending-* from any status carrying them."""
        self._activity(now)
        outcome = classify_status(code, description)
        if pending_msgs is not None:
            self.pending_msgs = max(self.pending_msgs - max(pending_msgs, 0), 0)
        if pending_bytes is not None:
            self.pending_bytes = max(self.pending_bytes - max(pending_bytes, 0), 0)
        if outcome is Outcome.REPULL:
            self.reset_pending()
        if (outcome is Outcome.IGNORE and code == STATUS_CONFLICT
                and description.strip().lower().startswith(MAX_BYTES_REACHED) and self.config.bytes_mode and pending_bytes is not None and pending_bytes >= self.config.max_bytes):
            # A request with the whole budget unused ended on the next message: it is larger than
            # consume.maxBytes, and every later pull would end the same way at once.
            outcome = Outcome.TOO_LARGE
        return StatusVerdict(outcome, code, description.strip())

    # ---------------------------------------------------------------- liveness

    def _activity(self, now: float | None) -> None:
        if now is not None:
            self.last_activity = now
            self.heartbeats_missed = 0

    def heartbeat_missed(self, now: float) -> bool:
        """ADR-37: no message, status or heartbeat for 2 x idle_heartbeat (timer paused while disconnected).

        When True, the pending counts are reset so that the next pull refills the
        buffer in full (nats.go does the same), and the clock restarts.
        """
        if self.paused or now - self.last_activity < 2 * self.config.idle_heartbeat:
            return False
        self.heartbeats_missed += 1
        self.last_activity = now
        self.reset_pending()
        return True

    def on_disconnect(self) -> None:
        """ADR-37: pause the heartbeat timer and stop publishing pull requests."""
        self.paused = True

    def on_reconnect(self, now: float) -> None:
        """ADR-37: reset the timer and publish a new pull request (pending starts over)."""
        self.paused = False
        self.last_activity = now
        self.reset_pending()

    def reset_pending(self) -> None:
        self.pending_msgs = 0
        self.pending_bytes = 0

"""KV buckets as JetStream streams (ADR-8, with ADR-43's per-key TTLs), free of I/O.

A bucket ``B`` is the stream ``KV_B`` capturing ``$KV.B.>``; key ``k`` is the subject
``$KV.B.k``. What the sink sends per operation is what nats-py's ``KeyValue`` sends:

* ``PUT``: the value, no operation header (``put``; ``create``/``update`` add
  ``Nats-Expected-Last-Subject-Sequence``);
* ``DEL``: an empty message with ``KV-Operation: DEL`` (``delete``; a TTL on it is
  refused: nats-py ignores one, so a user asking for it is told to purge instead);
* ``PURGE``: an empty message with ``KV-Operation: PURGE`` and ``Nats-Rollup: sub``,
  which removes the key's history; a TTL makes that tombstone expire (``purge(msg_ttl=)``).

:func:`plan_bucket` decides what ``ensureBucket`` does with the bucket's stream, as
:func:`pyspark_jetstream.protocol.stream_rules.plan_stream` does for streams.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .headers import (
    EXPECTED_LAST_MSG_ID,
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    KV_OPERATION,
    MSG_ID,
    ROLLUP,
    parse_headers,
)
from .puback import DUPLICATE as DUPLICATE_OUTCOME
from .stream_rules import StreamPlan, StreamRuleError, check_ttl_transition, plan_missing, refuse_mirror

PUT, DEL, PURGE = "PUT", "DEL", "PURGE"
OPERATIONS = (PUT, DEL, PURGE)

MAX_HISTORY = 64
"""nats-py and the NATS CLI refuse a longer per-key history."""

DEFAULT_DUPLICATE_WINDOW_S = 120.0
"""nats-py's ``create_key_value``: 2 minutes, or the bucket's TTL when that is shorter."""

_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
_NS = 1_000_000_000

OPERATION_HEADERS = {
    PUT: "",
    DEL: f"{KV_OPERATION}: DEL\r\n",
    PURGE: f"{KV_OPERATION}: PURGE\r\n{ROLLUP}: sub\r\n",
}
"""The header lines each operation adds to the block (nats-py's ``KeyValue``)."""


ERR_WRONG_LAST_SEQUENCE = 10071
"""The server's err_code for a compare-and-set whose expected last subject sequence is stale."""

ERR_LAST_SEQUENCE_IN_PROCESS = 10164
"""``wrong last sequence`` without a sequence: a replicated stream refuses a compare-and-set while another
row of the key that expects a last sequence is proposed but not applied (nats-server
``checkMsgHeadersPreClusteredProposal``). Not yet an answer: the row is sent again."""

ERR_JETSTREAM_UNAVAILABLE = 10008
"""``JetStream system temporarily unavailable`` (code 503): an election or a proposal in flight."""

WRONG_LAST_SEQUENCE = (ERR_WRONG_LAST_SEQUENCE, ERR_LAST_SEQUENCE_IN_PROCESS)
"""nats-py's ``KeyWrongLastSequenceError`` takes both."""

_CREATE_LINE = f"\r\n{EXPECTED_LAST_SUBJECT_SEQUENCE}: 0\r\n".encode()


def is_create(header_block: bytes) -> bool:
    """Whether a KV write's header block is a ``create``: a PUT (no operation header) expecting
    the key to have no last sequence (``expected_revision`` 0)."""
    return _CREATE_LINE in header_block and KV_OPERATION.encode() not in header_block


def tombstone_revision(seq: int, header_block: bytes) -> int | None:
    """``seq`` when the key's last message (its header block) is a DEL or PURGE tombstone, else None.

    nats-py's ``kv.create`` refused with 10071 looks the key's last entry up and, when it is
    such a tombstone, puts again expecting that revision: a deleted key may be created again."""
    operation = parse_headers(header_block).get(KV_OPERATION) if header_block else None
    return seq if operation and operation[-1].strip() in (DEL, PURGE) else None


def recreate_block(header_block: bytes, revision: int) -> bytes:
    """A ``create``'s header block expecting the tombstone's ``revision`` instead of no sequence."""
    return header_block.replace(_CREATE_LINE, f"\r\n{EXPECTED_LAST_SUBJECT_SEQUENCE}: {revision}\r\n".encode(), 1)


ERR_WRONG_LAST_MSG_ID = 10070
"""The server's err_code for a publish whose ``Nats-Expected-Last-Msg-Id`` is not the stream's last id."""


def duplicate_probe_headers(msg_id: str, never: str) -> dict[str, str]:
    """The headers of an empty publish that asks whether ``msg_id`` is in the stream's duplicate window
    and stores nothing either way: ``Nats-Expected-Last-Msg-Id`` set to ``never`` (an id no message
    carries) is checked after de-duplication on every server from 2.10, clustered or not (nats-server
    ``processJetStreamMsg``; ``checkMsgHeadersPreClusteredProposal`` de-duplicates before proposing), so
    the answer is ``duplicate`` when the window holds the id, else a refusal with 10070.

    Unlike the row itself: from nats-server 2.12 a single server checks a row's
    ``Nats-Expected-Last-Subject-Sequence`` *before* its id, so a compare-and-set row sent again
    after it was stored is refused with 10071, not answered ``duplicate``, even inside the window."""
    return {MSG_ID: msg_id, EXPECTED_LAST_MSG_ID: never}


def probe_answer(outcome: str, err_code: int | None) -> bool | None:
    """What a :func:`duplicate_probe_headers` publish answered (its PubAck's outcome and err_code): True
    when the window holds the id, False when it does not (10070), None for anything else (cannot tell)."""
    if outcome == DUPLICATE_OUTCOME:
        return True
    return False if err_code == ERR_WRONG_LAST_MSG_ID else None


def expected_revision_of(header_block: bytes) -> int:
    """The revision a compare-and-set row's header block expects (0 when it carries none or no number).
    Had the row been stored, its message would come after that revision."""
    values = parse_headers(header_block).get(EXPECTED_LAST_SUBJECT_SEQUENCE) if header_block else None
    return int(values[-1]) if values and values[-1].isdigit() else 0


def msg_id_of(header_block: bytes) -> str | None:
    """The ``Nats-Msg-Id`` of a stored message's header block, or None."""
    values = parse_headers(header_block).get(MSG_ID) if header_block else None
    return values[-1] if values else None


def is_valid_key(key: str) -> bool:
    """nats-py's key rule: letters, digits and ``-/_=.``, not starting or ending with ``.``."""
    return bool(key) and key[0] != "." and key[-1] != "." and _KEY_RE.fullmatch(key) is not None


_KEY_TOKEN_RE = re.compile(r"[-/_=a-zA-Z0-9]+")


def is_valid_key_filter(key: str) -> bool:
    """A key, or a key filter as nats-py's ``keys(filters=...)`` and ``watch`` take it: tokens split at
    ``.``, each a key's characters, or ``*`` (one token), or ``>`` (the rest, last token only)."""
    tokens = key.split(".")
    return bool(key) and all(
        t == "*" or (t == ">" and i == len(tokens) - 1) or _KEY_TOKEN_RE.fullmatch(t) is not None
        for i, t in enumerate(tokens))


def stream_name(bucket: str) -> str:
    return f"KV_{bucket}"


def subject_prefix(bucket: str) -> str:
    return f"$KV.{bucket}."


def parse_operation(value: Any) -> str | None:
    """A row's ``operation``: null means ``PUT``; ``PUT``, ``DEL`` or ``PURGE`` as KV names them;
    anything else (other spellings included) None, a row refusal."""
    if value is None:
        return PUT
    return value if value in OPERATIONS else None


@dataclass(frozen=True)
class BucketSettings:
    """A bucket the sink creates or updates (``bucket.*`` options), as a KV user names them."""

    history: int = 1
    ttl: float = 0.0  # the bucket's max age in seconds; 0 = none
    max_value_size: int = -1
    storage: str = "file"
    replicas: int = 1
    limit_marker_ttl: float | None = None  # SubjectDeleteMarkerTTL (ADR-43), at least 1s


def new_bucket_config(bucket: str, s: BucketSettings) -> dict[str, Any]:
    """The stream nats-py's ``create_key_value`` creates for these settings (AllowMsgTTL on)."""
    window = DEFAULT_DUPLICATE_WINDOW_S
    if s.ttl and s.ttl < window:
        window = s.ttl
    config: dict[str, Any] = {
        "name": stream_name(bucket),
        "subjects": [f"{subject_prefix(bucket)}>"],
        "retention": "limits",
        "storage": s.storage,
        "num_replicas": s.replicas,
        "max_age": int(round(s.ttl * _NS)),
        "max_bytes": -1,
        "max_msgs": -1,
        "max_consumers": -1,
        "max_msg_size": s.max_value_size,
        "max_msgs_per_subject": s.history,
        "duplicate_window": int(round(window * _NS)),
        "discard": "new",
        "allow_direct": True,
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "allow_msg_ttl": True,
    }
    if s.limit_marker_ttl is not None:
        config["subject_delete_marker_ttl"] = int(round(s.limit_marker_ttl * _NS))
    return config


def plan_bucket(current: dict[str, Any] | None, bucket: str, settings: BucketSettings, mode: str, *,
                needs_ttl: bool, may_purge: bool) -> StreamPlan:
    """Decide, without I/O, how ``ensureBucket`` brings the bucket in line, or refuse before a row is sent.

    ``current`` is the ``config`` of the bucket stream's STREAM.INFO (None when missing);
    ``needs_ttl``: rows can carry a TTL; ``may_purge``: rows can be PURGE operations.
    """
    name = stream_name(bucket)
    if current is None:
        return plan_missing(mode, f"KV bucket '{bucket}' does not exist (no stream {name}). Create it (e.g. "
                                  f"`nats kv add {bucket}`) or set the option ensureBucket to 'create'.",
                            new_bucket_config(bucket, settings))
    refuse_mirror(current, f"KV bucket '{bucket}'", "writes. Write to the origin bucket instead.")
    config = dict(current)
    changes: list[str] = []

    def need(setting: str, fix: str, change: str, **values: Any) -> None:
        if mode != "update":
            raise StreamRuleError(
                f"KV bucket '{bucket}' has {setting}, but {fix} Set ensureBucket='update' to change it, or "
                f"`nats stream edit {name}`."
            )
        config.update(values)
        changes.append(change)

    if needs_ttl and not current.get("allow_msg_ttl"):
        need("AllowMsgTTL false", "rows can carry a per-key TTL (a 'ttl' column, 'defaultTtl' or 'preserveExpiry').",
             "AllowMsgTTL enabled", allow_msg_ttl=True)
    if may_purge and not current.get("allow_rollup_hdrs"):
        need("AllowRollup false", "PURGE rows roll the key's history up (Nats-Rollup: sub).",
             "AllowRollup enabled", allow_rollup_hdrs=True)
    marker = settings.limit_marker_ttl
    if marker is not None and current.get("subject_delete_marker_ttl", 0) != int(round(marker * _NS)):
        if current.get("deny_purge"):
            raise StreamRuleError(
                f"KV bucket '{bucket}' has DenyPurge=true, which an update cannot turn off, and limit markers need "
                "DenyPurge=false (ADR-43). Recreate the bucket, or drop the option 'bucket.limitMarkerTtl'."
            )
        need(f"a limit marker TTL of {current.get('subject_delete_marker_ttl', 0) / _NS:g}s",
             f"the option 'bucket.limitMarkerTtl' asks for {marker:g}s.",
             f"limit marker TTL set to {marker:g}s", subject_delete_marker_ttl=int(round(marker * _NS)),
             allow_rollup_hdrs=True, deny_purge=False, allow_msg_ttl=True)
    check_ttl_transition(current, config)
    if not changes:
        return StreamPlan("none")
    return StreamPlan("update", config, tuple(changes))


def short_duplicate_window(config: dict[str, Any]) -> float | None:
    """The bucket's duplicate window in seconds when it is under 2 minutes (exactly-once only holds
    for a replay inside it), else None."""
    window = (config.get("duplicate_window") or 0) / _NS
    return window if window < DEFAULT_DUPLICATE_WINDOW_S else None

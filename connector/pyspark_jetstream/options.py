"""Option names, their documentation, and parsing into frozen dataclasses.

Parsing runs in three steps, as nats.go does for its consume options: every raw
string becomes a typed value checked against its own range; then defaults and
cross-option rules; then unknown keys are refused with the nearest known name.
It runs on the driver when the query starts, so a typo fails ``save()`` /
``start()`` before anything is published.

The :data:`CONNECTION_OPTIONS` and :data:`SINK_OPTIONS` tables are the option
reference: the README's tables are generated from them and a test keeps the two
in step.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import OptionError
from .protocol.kv import MAX_HISTORY, BucketSettings
from .protocol.ttl import ALLOWED_TTL, InvalidTtl, parse_go_duration, resolve_ttl

# Keys Spark itself puts into a query's options; never ours to judge. A catalog table
# (``CREATE TABLE ... USING jetstream OPTIONS (...)``) adds its reserved table properties
# (``TableCatalog.PROP_*``) and a copy of every option under ``option.``.
SPARK_OWNED_KEYS = frozenset({
    "path", "checkpointlocation", "queryname",
    "provider", "owner", "location", "comment", "external", "is_managed_location", "collation",
})
SPARK_OWNED_PREFIX = "option."

# Spark keeps a catalog table's OPTIONS (CREATE TABLE ... USING jetstream OPTIONS (...)) in the catalog
# and, in PySpark 4.3, hands a Python data source none of them when the table is read or written.
CATALOG_TABLE_HINT = (
    "No option reached the connector at all. A table created with CREATE TABLE ... USING jetstream "
    "keeps its OPTIONS in the catalog, and Spark does not pass them to a Python data source when the "
    "table is read or written: give them in the query (SELECT ... FROM t WITH ('servers' = '...', "
    "'stream' = '...'); INSERT INTO t WITH (...) ...), or use CREATE TEMPORARY VIEW v USING jetstream "
    "OPTIONS (...)."
)


def _user_keys(raw: Mapping[str, str]) -> list[str]:
    """The option names the user gave (Spark's own keys left out)."""
    return [k for k in raw if k.lower() not in SPARK_OWNED_KEYS and not k.lower().startswith(SPARK_OWNED_PREFIX)]


_KAFKA_STREAM = "'stream' (the JetStream stream to read; filter its subjects with 'subjects')"
KAFKA_HINTS = {  # lower-cased Kafka connector option -> what JetStream users set instead
    "subscribe": _KAFKA_STREAM,
    "subscribepattern": _KAFKA_STREAM,
    "assign": _KAFKA_STREAM,
    "kafka.bootstrap.servers": "'servers' (NATS URLs, comma-separated)",
    "maxoffsetspertrigger": "'maxMessagesPerTrigger'",
    "startingoffsetsbytimestamp": "'startingTimestamp'",
    "startingtimestamp": "'startingTimestamp'",
    "endingoffsetsbytimestamp": "'endingOffsets' (a stream sequence)",
    "topic": "the option 'subject' (or a 'subject' column)",
    "includeheaders": "nothing: the 'headers' column is always read",
    "groupidprefix": "nothing: reads hold no consumer group (see 'bookmarkConsumer' to show progress)",
    "kafka.group.id": "nothing: reads hold no consumer group (see 'bookmarkConsumer' to show progress)",
}
"""Spark's Kafka connector options a user may reach for, and the JetStream option that does the job."""

_SUBJECT_BAD = re.compile(r"\s|(^|\.)[*>](\.|$)|^\.|\.\.|\.$")
_STREAM_NAME_BAD = re.compile(r"[\s.*>/\\]")


class Secret:
    """A credential that never prints: ``repr``/``str`` are redacted, ``reveal()`` is explicit."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))


@dataclass(frozen=True)
class OptionSpec:
    """One user-facing option: how it parses and how the README documents it."""

    name: str
    default: str | None
    allowed: str
    doc: str
    parse: Callable[[str], Any]
    secret: bool = False


# ---------------------------------------------------------------- value parsers


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError(raw)


def parse_int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        text = raw.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise ValueError(raw)
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(raw)
        return value

    return parse


def parse_duration_seconds(minimum: float = 0.0) -> Callable[[str], float]:
    """Whole seconds (``30``) or a Go duration (``30s``, ``1m30s``, ``500ms``)."""

    def parse(raw: str) -> float:
        text = raw.strip()
        seconds = float(int(text)) if text.isdigit() else parse_go_duration(text) / 1e9
        if seconds < minimum:
            raise ValueError(raw)
        return seconds

    return parse


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        lowered = raw.strip().lower()
        if lowered not in choices:
            raise ValueError(raw)
        return lowered

    return parse


def is_publish_subject(subject: str) -> bool:
    """A subject a message can be published to: no whitespace, no wildcard or empty token."""
    return bool(subject) and not _SUBJECT_BAD.search(subject)


def parse_subject(raw: str) -> str:
    if not is_publish_subject(raw):
        raise ValueError(raw)
    return raw


def parse_subject_filters(raw: str) -> tuple[str, ...]:
    """Comma-separated subjects; wildcards allowed (they name what a stream captures)."""
    parts = tuple(p.strip() for p in raw.split(","))
    if not parts or any(not p or re.search(r"\s|^\.|\.\.|\.$", p) for p in parts):
        raise ValueError(raw)
    return parts


_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")


def parse_name(raw: str) -> str:
    """A JetStream domain, KV bucket or consumer name: letters, digits, '-' and '_'."""
    if not _NAME_RE.fullmatch(raw.strip()):
        raise ValueError(raw)
    return raw.strip()


def parse_stream_name(raw: str) -> str:
    if not raw or _STREAM_NAME_BAD.search(raw):
        raise ValueError(raw)
    return raw


def parse_servers(raw: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in raw.split(",") if p.strip())
    if not parts:
        raise ValueError(raw)
    for part in parts:
        # Credentials belong in the secret options, which are redacted; a URL is not.
        if "@" in part or not re.fullmatch(r"((nats|tls|ws|wss)://)?[^\s/,]+(:\d+)?/?", part):
            raise ValueError(raw)
    return parts


_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


def mask_userinfo(text: str) -> str:
    """``text`` with everything from its start (after a leading ``scheme://``) up to its
    **last** ``@`` replaced by ``***``.

    A password may hold ``/``, ``@``, ``:``, ``,`` or spaces, so no URL grammar can
    tell where it ends; only the last ``@`` is sure to follow it. In a list of URLs
    this hides the hosts before that ``@`` too, which is the price of never
    printing a piece of a password.
    """
    cut = text.rfind("@")
    if cut < 0:
        return text
    scheme = _SCHEME.match(text)
    return (scheme.group(0) if scheme and scheme.end() <= cut else "") + "***" + text[cut:]


def _shown(spec: OptionSpec, value: object) -> object:
    """How a bad value appears in an error: secrets masked, and so is any
    ``user:password@`` a URL carries by mistake."""
    if spec.secret:
        return Secret(str(value))
    if isinstance(value, str):
        return mask_userinfo(value)
    return value


def parse_existing_file(raw: str) -> str:
    path = os.path.expanduser(raw.strip())
    if not os.path.isfile(path):
        raise ValueError(raw)
    return path


def parse_ttl_option(raw: str) -> str | None:
    try:
        return resolve_ttl(raw)
    except InvalidTtl:
        raise ValueError(raw) from None


def parse_secret(raw: str) -> Secret:
    if raw == "":
        raise ValueError(raw)
    return Secret(raw)


def parse_text(raw: str) -> str:
    if not raw.strip():
        raise ValueError(raw)
    return raw


# ---------------------------------------------------------------- option tables

_FILE = "Expected the path of a readable file that exists on the driver and on every executor."

CONNECTION_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("servers", "nats://127.0.0.1:4222", "Expected comma-separated NATS URLs such as 'nats://host:4222,tls://host2:4222', "
               "without credentials (use 'user'/'password', 'token', 'credsFile' or 'nkeySeedFile').",
               "NATS server URLs, comma-separated.", parse_servers),
    OptionSpec("user", None, "Expected a non-empty user name.", "User name (with `password`).", parse_text),
    OptionSpec("password", None, "Expected a non-empty password.", "Password (with `user`). Redacted everywhere.", parse_secret, secret=True),
    OptionSpec("token", None, "Expected a non-empty token.", "Authentication token. Redacted everywhere.", parse_secret, secret=True),
    OptionSpec("credsFile", None, _FILE, "Path of a `.creds` file (JWT and NKey seed, operator mode).", parse_existing_file),
    OptionSpec("nkeySeedFile", None, _FILE, "Path of a file holding an NKey user seed.", parse_existing_file),
    OptionSpec("tlsCaFile", None, _FILE, "CA certificate (PEM) to verify the servers.", parse_existing_file),
    OptionSpec("tlsCertFile", None, _FILE, "Client certificate (PEM) for mutual TLS (with `tlsKeyFile`).", parse_existing_file),
    OptionSpec("tlsKeyFile", None, _FILE, "Client private key (PEM) for mutual TLS (with `tlsCertFile`).", parse_existing_file),
    OptionSpec("connectTimeout", "10s", "Expected a duration of at least 1s, such as '10s'.",
               "How long to wait for a connection to the servers.", parse_duration_seconds(1.0)),
    OptionSpec("domain", None, "Expected a JetStream domain name (letters, digits, '-' and '_').",
               "JetStream domain of the stream, when it is not the connected server's own (a hub seen from a leaf "
               "node, a leaf seen from the hub): every JetStream API request goes to `$JS.<domain>.API`. Exclusive "
               "with `apiPrefix`.", parse_name),
    OptionSpec("apiPrefix", None, "Expected a subject prefix without wildcards or whitespace, such as 'JS.hub.API'.",
               "Prefix under which this account imports another account's JetStream API (instead of `$JS.API`). "
               "Exclusive with `domain`.", lambda raw: parse_subject(raw.strip().rstrip("."))),
)

def parse_write_id(raw: str) -> str:
    text = raw.strip()
    if not re.fullmatch(r"[-_=a-zA-Z0-9]{1,200}", text):
        raise ValueError(raw)
    return text


SINK_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("stream", None, "Expected a stream name without whitespace, '.', '*', '>', '/' or '\\'.",
               "Target stream. When set, every publish carries `Nats-Expected-Stream` and the stream is checked "
               "at query start (see `ensureStream`).", parse_stream_name),
    OptionSpec("subject", None, "Expected a publish subject without wildcards or whitespace, such as 'orders.new'.",
               "Subject for rows without a `subject` column (or whose `subject` is null).", parse_subject),
    OptionSpec("defaultTtl", None, ALLOWED_TTL,
               "TTL for rows whose `ttl` is null; a row's own `ttl` overrides it.", parse_ttl_option),
    OptionSpec("preserveExpiry", "false", "Expected 'true' or 'false'.",
               "Take each row's TTL from `expires_at` (remaining lifetime, rounded up to whole seconds); "
               "rows already expired are counted and not published.", parse_bool),
    OptionSpec("ensureStream", "validate", "Expected one of 'validate', 'create', 'update'.",
               "`validate`: the stream must exist and allow TTLs when rows can carry one; `create`: create it "
               "when missing; `update`: also enable AllowMsgTTL / set SubjectDeleteMarkerTTL on an existing stream.",
               parse_choice("validate", "create", "update")),
    OptionSpec("idempotent", "true", "Expected 'true' or 'false'.",
               "Give rows without `msg_id` a deterministic `Nats-Msg-Id` (the run, and the source message and "
               "content, or the partition and row: see Guarantees) so that retries and restarts are de-duplicated "
               "by the server.", parse_bool),
    OptionSpec("writeId", None, "Expected letters, digits, '-', '_' or '=' (at most 200).",
               "Batch writes: a stable id of this write (e.g. the scheduler's run id). A retried `save()` with the "
               "same id gives every row the id it had and stores nothing twice, however late it runs (see "
               "[Guarantees](#guarantees)). Default: a new id per `save()`.", parse_write_id),
    OptionSpec("sinkState", "SPARK_JETSTREAM_SINK", "Expected a KV bucket name (letters, digits, '-' and '_'), "
               "or 'none'.",
               "KV bucket where the sink records, per micro-batch (and per `writeId`), where the target stood "
               "before it published, so that a replay later than the duplicate window publishes only what is "
               "missing; created when missing. `none`: exactly-once only within the duplicate window.",
               lambda raw: None if raw.strip().lower() == "none" else parse_name(raw)),
    OptionSpec("sinkState.ttl", "168h", "Expected a duration of at least 1m, such as '168h'.",
               "How long the sink's records live (the state bucket's MaxAge when the sink creates it): a replay "
               "or a `writeId` retry later than this may store rows again.", parse_duration_seconds(60.0)),
    OptionSpec("maxPendingAcks", "4096", "Expected an integer from 1 to 1000000.",
               "How many publishes may await their PubAck at once.", parse_int_range(1, 1_000_000)),
    OptionSpec("ackTimeout", "30s", "Expected a duration of at least 1s, such as '30s'.",
               "Fail the task when no PubAck arrives for this long while publishes are outstanding.",
               parse_duration_seconds(1.0)),
    OptionSpec("deadLetterSubject", None, "Expected a publish subject without wildcards, captured by a stream.",
               "Rows rejected by the server or by client-side validation are published here (original subject "
               "and data, headers naming the error) instead of failing the write.", parse_subject),
    OptionSpec("allowRollup", "false", "Expected 'true' or 'false'.",
               "Allow a `Nats-Rollup` header in the `headers` column (it purges other messages).", parse_bool),
    OptionSpec("stream.subjects", None, "Expected comma-separated subjects, wildcards allowed, such as 'orders.>'.",
               "Subjects of a stream created by `ensureStream=create` (default: the `subject` option).",
               parse_subject_filters),
    OptionSpec("stream.storage", "file", "Expected 'file' or 'memory'.",
               "Storage of a created stream.", parse_choice("file", "memory")),
    OptionSpec("stream.replicas", "1", "Expected an integer from 1 to 5.",
               "Replicas of a created stream.", parse_int_range(1, 5)),
    OptionSpec("stream.maxAge", "0", "Expected a duration such as '24h', or 0 for unlimited.",
               "MaxAge of a created stream.", parse_duration_seconds(0.0)),
    OptionSpec("stream.maxMsgsPerSubject", "-1", "Expected an integer >= -1 (-1 for unlimited).",
               "MaxMsgsPerSubject of a created stream.", parse_int_range(-1)),
    OptionSpec("stream.duplicateWindow", "2m", "Expected a duration of at least 1s, such as '2m'.",
               "Duplicate window of a created stream: how long `Nats-Msg-Id` de-duplication lasts.",
               parse_duration_seconds(1.0)),
    OptionSpec("stream.subjectDeleteMarkerTtl", None, "Expected a duration of at least 1s, such as '15m' (ADR-43 minimum).",
               "SubjectDeleteMarkerTTL for `create`/`update`: the server places a `MaxAge` marker when the last "
               "message of a subject expires.", parse_duration_seconds(1.0)),
)

KV_SINK_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("bucket", None, "Expected a KV bucket name (letters, digits, '-' and '_').",
               "Write to this KV bucket instead of a stream: each row is a key operation (columns `key`, `data`, "
               "`operation`, `ttl`, `expected_revision`; see [KV buckets](#kv-buckets)).", parse_name),
    OptionSpec("ensureBucket", "validate", "Expected one of 'validate', 'create', 'update'.",
               "`validate`: the bucket must exist and take what the rows carry (TTLs, purges); `create`: create it "
               "as nats-py's `create_key_value` would; `update`: also enable per-key TTLs, roll-ups or the limit "
               "marker TTL on an existing bucket.", parse_choice("validate", "create", "update")),
    OptionSpec("bucket.history", "1", f"Expected an integer from 1 to {MAX_HISTORY}.",
               "Values kept per key in a created bucket (KV history).", parse_int_range(1, MAX_HISTORY)),
    OptionSpec("bucket.ttl", "0", "Expected a duration such as '24h', or 0 for none.",
               "Max age of every value in a created bucket (KV TTL); per-key TTLs (`ttl`) can only be shorter.",
               parse_duration_seconds(0.0)),
    OptionSpec("bucket.maxValueSize", "-1", "Expected an integer >= -1 (-1 for unlimited).",
               "Largest value a created bucket accepts, in bytes.", parse_int_range(-1)),
    OptionSpec("bucket.storage", "file", "Expected 'file' or 'memory'.",
               "Storage of a created bucket.", parse_choice("file", "memory")),
    OptionSpec("bucket.replicas", "1", "Expected an integer from 1 to 5.",
               "Replicas of a created bucket.", parse_int_range(1, 5)),
    OptionSpec("bucket.limitMarkerTtl", None, "Expected a duration of at least 1s, such as '15m' (ADR-43 minimum).",
               "Limit marker TTL (SubjectDeleteMarkerTTL) for `create`/`update`: when a key's last value expires the "
               "server leaves a marker that watchers see as a purge, kept this long.", parse_duration_seconds(1.0)),
    OptionSpec("sequenceBy", None, "Expected the name of a column of type byte, short, int, long, timestamp, "
               "timestamp_ntz, date or string.",
               "Column that orders the rows of one key: the bucket keeps, per key, the row with the greatest value, "
               "whichever task, micro-batch or writer publishes last; older rows are skipped and counted (see "
               "[Keeping each key's newest row](#keeping-each-keys-newest-row-sequenceby)).", parse_text),
)


def _spec_index(specs: Iterable[OptionSpec]) -> dict[str, OptionSpec]:
    return {spec.name.lower(): spec for spec in specs}


def parse_table(
    raw: Mapping[str, str],
    specs: tuple[OptionSpec, ...],
    *,
    direction: str,
    other_direction: Iterable[OptionSpec] = (),
) -> dict[str, Any]:
    """Steps 1 and 3: typed values for every known key (defaults filled in), unknown keys refused."""
    index = _spec_index(specs)
    other = _spec_index(other_direction)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        lowered = key.lower()
        if lowered in SPARK_OWNED_KEYS or lowered.startswith(SPARK_OWNED_PREFIX):
            continue
        spec = index.get(lowered)
        if spec is None:
            if lowered in other:
                raise OptionError(other[lowered].name, value, f"This option does not apply when {direction}.")
            names = [s.name for s in specs]
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6) or difflib.get_close_matches(
                lowered, [n.lower() for n in names], n=1, cutoff=0.6
            )
            hint = f" Did you mean '{index[close[0].lower()].name}'?" if close else ""
            kafka = KAFKA_HINTS.get(lowered)
            if kafka is None and lowered.startswith("kafka."):
                kafka = "the connection options ('servers', 'user', 'password', 'token', 'credsFile', " \
                        "'nkeySeedFile', 'tlsCaFile', 'tlsCertFile', 'tlsKeyFile')"
            if kafka is not None:
                hint = f" It is a Kafka option; for JetStream use {kafka}."
            raise OptionError(key, value, f"when {direction}.{hint} Known options: {', '.join(names)}.", unknown=True)
        values[spec.name] = _parse_one(spec, value)
    for spec in specs:
        if spec.name not in values:
            values[spec.name] = None if spec.default is None else _parse_one(spec, spec.default)
    return values


def _parse_one(spec: OptionSpec, value: object) -> Any:
    shown = _shown(spec, value)
    if not isinstance(value, str):
        raise OptionError(spec.name, shown, spec.allowed)
    try:
        return spec.parse(value)
    except (ValueError, OverflowError):
        raise OptionError(spec.name, shown, spec.allowed) from None


# ---------------------------------------------------------------- parsed options


@dataclass(frozen=True)
class ConnectionOptions:
    """Everything needed to open a connection; hashable so connections can be cached by it."""

    servers: tuple[str, ...]
    user: str | None = None
    password: Secret | None = None
    token: Secret | None = None
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class StreamSettings:
    """Settings for a stream the sink creates or updates (``stream.*`` options)."""

    subjects: tuple[str, ...] | None
    storage: str
    replicas: int
    max_age: float
    max_msgs_per_subject: int
    duplicate_window: float
    subject_delete_marker_ttl: float | None


@dataclass(frozen=True)
class SinkOptions:
    connection: ConnectionOptions
    stream: str | None
    subject: str | None
    default_ttl: str | None
    preserve_expiry: bool
    ensure_stream: str
    idempotent: bool
    max_pending_acks: int
    ack_timeout: float
    dead_letter_subject: str | None
    allow_rollup: bool
    stream_settings: StreamSettings
    api_prefix: str = "$JS.API"  # where JetStream API requests go (options 'domain' / 'apiPrefix')
    bucket: str | None = None  # a KV bucket instead of a stream (KV_SINK_OPTIONS)
    ensure_bucket: str = "validate"
    bucket_settings: BucketSettings | None = None
    write_id: str | None = None  # a batch write's stable id (option 'writeId')
    state_bucket: str | None = "SPARK_JETSTREAM_SINK"  # where replays find what was stored (None: off)
    state_ttl: float = 7 * 86400.0
    sequence_by: str | None = None  # a KV write's ordering column (option 'sequenceBy', sink/sequencer.py)


def api_prefix(values: Mapping[str, Any]) -> str:
    """The JetStream API prefix the options ask for: ``$JS.API``, ``$JS.<domain>.API`` or ``apiPrefix``."""
    if values["domain"] is not None and values["apiPrefix"] is not None:
        raise OptionError("apiPrefix", values["apiPrefix"], "Set either 'domain' or 'apiPrefix', not both.")
    if values["domain"] is not None:
        return f"$JS.{values['domain']}.API"
    return values["apiPrefix"] or "$JS.API"


def _connection_from(values: Mapping[str, Any]) -> ConnectionOptions:
    if (values["user"] is None) != (values["password"] is None):
        missing = "password" if values["password"] is None else "user"
        raise OptionError(missing, None, "Options 'user' and 'password' must be set together.")
    methods = [
        name
        for name, present in (
            ("user/password", values["user"] is not None),
            ("token", values["token"] is not None),
            ("credsFile", values["credsFile"] is not None),
            ("nkeySeedFile", values["nkeySeedFile"] is not None),
        )
        if present
    ]
    if len(methods) > 1:
        raise OptionError(methods[1], "<set>", f"Choose one authentication method; got {' and '.join(methods)}.")
    if (values["tlsCertFile"] is None) != (values["tlsKeyFile"] is None):
        missing = "tlsKeyFile" if values["tlsKeyFile"] is None else "tlsCertFile"
        raise OptionError(missing, None, "Options 'tlsCertFile' and 'tlsKeyFile' must be set together.")
    return ConnectionOptions(
        servers=values["servers"],
        user=values["user"],
        password=values["password"],
        token=values["token"],
        creds_file=values["credsFile"],
        nkey_seed_file=values["nkeySeedFile"],
        tls_ca_file=values["tlsCaFile"],
        tls_cert_file=values["tlsCertFile"],
        tls_key_file=values["tlsKeyFile"],
        connect_timeout=values["connectTimeout"],
    )


def check_write_has_options(raw: Mapping[str, str]) -> None:
    """A write with no option at all is a catalog table's INSERT whose OPTIONS Spark kept back (see
    :data:`CATALOG_TABLE_HINT`), never a write meant for a default server: refuse it, saying why."""
    if not _user_keys(raw):
        raise OptionError("servers", None, CATALOG_TABLE_HINT)


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    values = parse_table(raw, CONNECTION_OPTIONS + SINK_OPTIONS + KV_SINK_OPTIONS, direction="writing",
                         other_direction=SOURCE_OPTIONS)
    connection = _connection_from(values)
    given = {k.lower(): k for k in _user_keys(raw)}
    bucket_settings = None
    if values["bucket"] is not None:
        for name in ("stream", "subject", "ensureStream"):
            if name.lower() in given:
                raise OptionError(given[name.lower()], _raw_value(raw, name),
                                  "A write goes to a KV bucket ('bucket') or to a stream, not both: with 'bucket' "
                                  "the subject is $KV.<bucket>.<key> and 'ensureBucket' sets the bucket up.")
        stream_only = [given[k] for k in given if k.startswith("stream.")]
        if stream_only:
            raise OptionError(stream_only[0], _raw_value(raw, stream_only[0]),
                              "With 'bucket', set the bucket up with the 'bucket.*' options (e.g. 'bucket.history').")
        bucket_settings = BucketSettings(
            history=values["bucket.history"], ttl=values["bucket.ttl"], max_value_size=values["bucket.maxValueSize"],
            storage=values["bucket.storage"], replicas=values["bucket.replicas"],
            limit_marker_ttl=values["bucket.limitMarkerTtl"])
    else:
        if values["sequenceBy"] is not None:
            raise OptionError("sequenceBy", values["sequenceBy"], "It orders the rows of each key of a KV bucket: "
                              "set 'bucket' too (a stream keeps every message; 'stream.maxMsgsPerSubject' keeps the "
                              "last published, not the newest).")
        kv_only = [given[k] for k in given if k == "ensurebucket" or k.startswith("bucket.")]
        if kv_only:
            raise OptionError(kv_only[0], _raw_value(raw, kv_only[0]), "It applies to KV writes: set 'bucket' too.")
    ensure = values["ensureStream"]
    if ensure in ("create", "update") and values["stream"] is None:
        raise OptionError("stream", None, f"ensureStream={ensure!r} needs the target stream's name in option 'stream'.")
    settings = StreamSettings(
        subjects=values["stream.subjects"],
        storage=values["stream.storage"],
        replicas=values["stream.replicas"],
        max_age=values["stream.maxAge"],
        max_msgs_per_subject=values["stream.maxMsgsPerSubject"],
        duplicate_window=values["stream.duplicateWindow"],
        subject_delete_marker_ttl=values["stream.subjectDeleteMarkerTtl"],
    )
    if ensure == "create" and settings.subjects is None and values["subject"] is None:
        raise OptionError(
            "stream.subjects", None, "ensureStream='create' needs the subjects of the new stream, e.g. 'orders.>'."
        )
    if (
        values["deadLetterSubject"] is not None
        and values["subject"] is not None
        and values["deadLetterSubject"] == values["subject"]
    ):
        raise OptionError("deadLetterSubject", values["deadLetterSubject"], "It must differ from option 'subject'.")
    return SinkOptions(
        connection=connection,
        stream=values["stream"],
        subject=values["subject"],
        default_ttl=values["defaultTtl"],
        preserve_expiry=values["preserveExpiry"],
        ensure_stream=ensure,
        idempotent=values["idempotent"],
        write_id=values["writeId"],
        state_bucket=values["sinkState"],
        state_ttl=values["sinkState.ttl"],
        max_pending_acks=values["maxPendingAcks"],
        ack_timeout=values["ackTimeout"],
        dead_letter_subject=values["deadLetterSubject"],
        allow_rollup=values["allowRollup"],
        stream_settings=settings,
        api_prefix=api_prefix(values),
        bucket=values["bucket"],
        ensure_bucket=values["ensureBucket"],
        bucket_settings=bucket_settings,
        sequence_by=values["sequenceBy"],
    )


# ---------------------------------------------------------------- source


class StartingPosition(NamedTuple):
    """Where a read starts: ``kind`` is 'earliest', 'latest', 'sequence' (``value`` the first
    sequence read) or 'timestamp' (``value`` a UTC datetime)."""

    kind: str
    value: Any = None


def parse_starting_offsets(raw: str) -> StartingPosition:
    text = raw.strip().lower()
    if text in ("earliest", "latest"):
        return StartingPosition(text)
    if text == "lastpersubject":
        return StartingPosition("last_per_subject")
    if text.isdigit() and int(text) >= 1:
        return StartingPosition("sequence", int(text))
    raise ValueError(raw)


def parse_ending_offsets(raw: str) -> int | None:
    text = raw.strip().lower()
    if text == "latest":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(raw)


def parse_timestamp(raw: str):
    """ISO-8601 with a zone, or epoch milliseconds, as a UTC datetime. A time without a zone is
    refused rather than guessed: UTC, the driver's zone and Spark's session zone would each read it
    differently, and a wrong guess moves the read by hours without a word."""
    import datetime as dt

    text = raw.strip()
    if re.fullmatch(r"\d{1,16}", text):
        return dt.datetime.fromtimestamp(int(text) / 1000, tz=dt.timezone.utc)
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(raw)
    return value.astimezone(dt.timezone.utc)


_TIMESTAMP_ALLOWED = ("Expected an ISO-8601 time with its zone, such as '2026-01-31T12:00:00Z', or epoch "
                      "milliseconds; a time without a zone is ambiguous: append 'Z' for UTC or an offset such as "
                      "'+02:00'.")


def _default_partitions() -> str:
    return str(os.cpu_count() or 2)


SOURCE_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("stream", None, "Expected a stream name without whitespace, '.', '*', '>', '/' or '\\'.",
               "Stream to read (required unless `bucket` is set).", parse_stream_name),
    OptionSpec("subjects", None, "Expected comma-separated subjects, wildcards allowed, such as 'orders.>,refunds.*'.",
               "Only read messages on these subjects (consumer filter subjects). Default: all.", parse_subject_filters),
    OptionSpec("bucket", None, "Expected a KV bucket name (letters, digits, '-' and '_').",
               "Read a KV bucket's change log (stream `KV_<bucket>`); adds the columns `key` and `operation`.",
               parse_name),
    OptionSpec("startingOffsets", None, "Expected 'earliest', 'latest', 'lastPerSubject' or a stream sequence >= 1 "
               "(inclusive).",
               "Where a new query starts: `earliest`, `latest`, an inclusive stream sequence, or `lastPerSubject`: "
               "the last message of each subject (of each key, live keys only, for a bucket) first, then every "
               "change after it, as a KV watch delivers. Default: `latest` for streaming, `earliest` for batch. "
               "Ignored when the checkpoint has an offset.",
               parse_starting_offsets),
    OptionSpec("kv.view", "changes", "Expected 'changes' or 'latest'.",
               "Batch reads of a bucket: `changes`, the change log (every put, delete and purge); `latest`, the "
               "bucket's current state: one row per live key, as `nats kv ls` and `get` show it.",
               parse_choice("changes", "latest")),
    OptionSpec("startingTimestamp", None, _TIMESTAMP_ALLOWED,
               "Start at the first message stored at or after this time (instead of `startingOffsets`).",
               parse_timestamp),
    OptionSpec("endingOffsets", "latest", "Expected 'latest' or a stream sequence >= 1 (inclusive).",
               "Batch reads only: the last sequence to read, inclusive.", parse_ending_offsets),
    OptionSpec("endingTimestamp", None, _TIMESTAMP_ALLOWED,
               "Batch reads only: end at the last message stored at or before this time (instead of "
               "`endingOffsets`).", parse_timestamp),
    OptionSpec("maxMessagesPerTrigger", None, "Expected an integer >= 1.",
               "Streaming: at most this many sequences per micro-batch (Spark's ReadMaxRows). PySpark 4.2+ (refused "
               "at start before: see [Compatibility](#compatibility)).", parse_int_range(1)),
    OptionSpec("minMessagesPerTrigger", None, "Expected an integer >= 1.",
               "Streaming: a micro-batch waits until at least this many new sequences are there, or until "
               "`maxTriggerDelay` has passed (Kafka's `minOffsetsPerTrigger`). `availableNow` reads what is there. "
               "PySpark 4.2+ (refused at start before).",
               parse_int_range(1)),
    OptionSpec("maxTriggerDelay", "15m", "Expected a duration of at least 1s, such as '15m'.",
               "Streaming, with `minMessagesPerTrigger`: the longest a micro-batch waits for that many sequences.",
               parse_duration_seconds(1.0)),
    OptionSpec("numPartitions", None, "Expected an integer from 1 to 10000.",
               "Spark partitions per micro-batch (see `split`). Default: the driver host's core count. The count "
               "is recorded with each offset, so a replayed micro-batch is split exactly as its first attempt "
               "was.", parse_int_range(1, 10_000)),
    OptionSpec("split", "subject", "Expected 'subject' or 'sequence'.",
               "How a read is split into partitions. `subject`: each subject's (each key's) messages are read by "
               "one partition in sequence order, so a copy written by the sink keeps every subject's order; "
               "`sequence`: contiguous sequence ranges, the fastest, but one subject's messages are spread over "
               "the partitions and parallel writes can store them out of order. See [Splits](#splits-order-per-subject).",
               parse_choice("subject", "sequence")),
    OptionSpec("failOnDataLoss", "true", "Expected 'true' or 'false'.",
               "Fail when planned sequences were removed from the stream before being read (limits, purge, TTL); "
               "`false` logs a warning with the range and goes on.", parse_bool),
    OptionSpec("bookmarkConsumer", None, "Expected a consumer name (letters, digits, '-' and '_').",
               "Streaming: a durable AckNone consumer of this name is moved to each committed offset, so NATS "
               "tools show the query's progress and lag. Spark's checkpoint stays the source of truth. nats-server "
               "2.14+ (refused at start before).", parse_name),
    OptionSpec("includeMarkers", "true", "Expected 'true' or 'false'.",
               "Keep the delete markers the server places (`marker_reason` set); `false` drops them.", parse_bool),
    OptionSpec("batchSize", "10000", "Expected an integer from 1 to 1000000.",
               "Rows per Arrow batch handed to Spark; with the consume buffer it bounds a partition's memory.",
               parse_int_range(1, 1_000_000)),
    OptionSpec("consume.maxMessages", None, "Expected an integer >= 1.",
               "ADR-37 buffer size in messages (default 10000); exclusive with `consume.maxBytes`.", parse_int_range(1)),
    OptionSpec("consume.maxBytes", None, "Expected an integer >= 1.",
               "ADR-37 buffer size in bytes; exclusive with `consume.maxMessages`.", parse_int_range(1)),
    OptionSpec("consume.thresholdMessages", None, "Expected an integer >= 0.",
               "Pull again when fewer messages than this are pending (default 50% of the buffer).", parse_int_range(0)),
    OptionSpec("consume.thresholdBytes", None, "Expected an integer >= 0.",
               "Bytes mode: pull again when fewer bytes than this are pending (default 50%).", parse_int_range(0)),
    OptionSpec("consume.expires", "30s", "Expected a duration of at least 1s, such as '30s'.",
               "Lifetime of each pull request.", parse_duration_seconds(1.0)),
    OptionSpec("consume.idleHeartbeat", None, "Expected a duration from 500ms to 30s, at most half of consume.expires.",
               "Server heartbeat interval; two missed heartbeats trigger a re-pull (default: half of "
               "`consume.expires`, at most 30s).", parse_duration_seconds(0.5)),
    OptionSpec("consume.maxWait", "60s", "Expected a duration of at least 1s, such as '60s'.",
               "Give up a partition with a clear error after this long without progress (server gone, consumer "
               "lost and not recreatable); the driver's planning requests are retried for as long.",
               parse_duration_seconds(1.0)),
)


@dataclass(frozen=True)
class SourceOptions:
    connection: ConnectionOptions
    stream: str
    subjects: tuple[str, ...] | None
    bucket: str | None
    starting: StartingPosition
    ending_seq: int | None
    ending_timestamp: Any  # a UTC datetime, or None
    max_messages_per_trigger: int | None
    min_messages_per_trigger: int | None
    max_trigger_delay: float
    num_partitions: int
    split: str
    fail_on_data_loss: bool
    bookmark_consumer: str | None
    include_markers: bool
    batch_size: int
    consume: Any  # pull_engine.ConsumeConfig
    max_wait: float
    api_prefix: str = "$JS.API"  # where JetStream API requests go (options 'domain' / 'apiPrefix')

    @property
    def filter_subjects(self) -> tuple[str, ...]:
        if self.subjects:
            return self.subjects
        if self.bucket:
            return (f"$KV.{self.bucket}.>",)
        return ()


def _check_read_bounds(raw: Mapping[str, str], values: dict[str, Any], given: set[str],
                       starting: StartingPosition) -> None:
    """A batch read's end must not lie before its start, and a latest view takes no end (the state as of
    an earlier point is not what the last message of each key says). Ends are batch-only, so a read
    that sets one is a batch read already at ``load()``."""
    ending = next((name for name in ("endingOffsets", "endingTimestamp") if name.lower() in given), None)
    if ending is None:
        return
    if starting.kind == "last_per_subject":
        view = "kv.view='latest'" if values["kv.view"] == "latest" else "startingOffsets='lastPerSubject'"
        raise OptionError(ending, _raw_value(raw, ending),
                          f"{view} reads the current value of each {'key' if values['bucket'] else 'subject'}; it "
                          "takes no end. For the state as of a sequence or a time, read the change log up to it "
                          "(kv.view='changes' or startingOffsets='earliest', with this option) and keep each "
                          "key's last row (a window ordered by 'seq').")
    if starting.kind == "latest":
        raise OptionError("startingOffsets", "latest", "A batch read from 'latest' reads nothing (it starts after "
                          "the last message); use 'earliest', a sequence or 'startingTimestamp', or "
                          "spark.readStream for messages still to come.")
    end_seq, end_time = values["endingOffsets"], values["endingTimestamp"]
    if starting.kind == "sequence" and end_seq is not None and end_seq < starting.value:
        raise OptionError("endingOffsets", _raw_value(raw, "endingOffsets"),
                          f"It is before 'startingOffsets' ({starting.value}): the end must be at or after the start.")
    if starting.kind == "timestamp" and end_time is not None and end_time < starting.value:
        raise OptionError("endingTimestamp", _raw_value(raw, "endingTimestamp"),
                          f"It is before 'startingTimestamp' ({_raw_value(raw, 'startingTimestamp')}): the end must "
                          "be at or after the start.")


def _raw_value(raw: Mapping[str, str], name: str) -> str:
    """The value the user gave option ``name`` (any case), for an error message."""
    return next((v for k, v in raw.items() if k.lower() == name.lower()), "<set>")


def parse_source_options(raw: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """The read's options; ``streaming=None`` when Spark has not said yet whether the read is a
    batch or a streaming one (``load()``): the checks of one kind only are then left for later."""
    from .protocol.pull_engine import ConsumeConfig, InvalidConsumeConfig

    values = parse_table(raw, CONNECTION_OPTIONS + SOURCE_OPTIONS, direction="reading",
                         other_direction=SINK_OPTIONS + tuple(s for s in KV_SINK_OPTIONS if s.name != "bucket"))
    given = {k.lower() for k in raw}
    connection = _connection_from(values)
    if values["bucket"] is not None and values["stream"] is not None:
        raise OptionError("bucket", values["bucket"], "Set either 'stream' or 'bucket', not both.")
    if values["bucket"] is None and values["stream"] is None:
        raise OptionError("stream", None, "Name the stream to read in option 'stream' (or a KV bucket in 'bucket')."
                          + ("" if _user_keys(raw) else " " + CATALOG_TABLE_HINT))
    stream = values["stream"] or f"KV_{values['bucket']}"
    if values["startingOffsets"] is not None and values["startingTimestamp"] is not None:
        raise OptionError("startingTimestamp", _raw_value(raw, "startingTimestamp"),
                          "Set either 'startingOffsets' or 'startingTimestamp', not both.")
    if values["startingTimestamp"] is not None:
        starting = StartingPosition("timestamp", values["startingTimestamp"])
    elif values["startingOffsets"] is not None:
        starting = values["startingOffsets"]
    else:
        starting = StartingPosition("latest" if streaming else "earliest")
    if values["kv.view"] == "latest":
        if values["bucket"] is None:
            raise OptionError("kv.view", "latest", "It applies to KV buckets: set 'bucket' (for a stream, "
                              "startingOffsets='lastPerSubject' reads the last message per subject).")
        if streaming:
            raise OptionError("kv.view", "latest", "It applies to batch reads; a streaming read of the current "
                              "state, then every change, is startingOffsets='lastPerSubject'.")
        for name in ("startingOffsets", "startingTimestamp"):
            if name.lower() in given:
                raise OptionError(name, _raw_value(raw, name), "kv.view='latest' reads the current state; it takes "
                                  "no starting position.")
        starting = StartingPosition("last_per_subject")
    for name in ("endingOffsets", "endingTimestamp"):
        if streaming and name.lower() in given:
            raise OptionError(name, _raw_value(raw, name), "It applies to batch reads only (spark.read).")
    if "endingoffsets" in given and values["endingTimestamp"] is not None:
        raise OptionError("endingTimestamp", _raw_value(raw, "endingTimestamp"),
                          "Set either 'endingOffsets' or 'endingTimestamp', not both.")
    _check_read_bounds(raw, values, given, starting)
    if "maxtriggerdelay" in given and values["minMessagesPerTrigger"] is None:
        raise OptionError("maxTriggerDelay", _raw_value(raw, "maxTriggerDelay"),
                          "It applies with 'minMessagesPerTrigger' only.")
    if values["minMessagesPerTrigger"] is not None and values["maxMessagesPerTrigger"] is not None \
            and values["minMessagesPerTrigger"] > values["maxMessagesPerTrigger"]:
        raise OptionError("minMessagesPerTrigger", str(values["minMessagesPerTrigger"]),
                          f"It must not exceed 'maxMessagesPerTrigger' ({values['maxMessagesPerTrigger']}).")
    for name in ("maxMessagesPerTrigger", "minMessagesPerTrigger", "maxTriggerDelay", "bookmarkConsumer"):
        if streaming is False and name.lower() in given:
            raise OptionError(name, values[name], "It applies to streaming reads only (spark.readStream).")
    try:
        consume = ConsumeConfig.build(
            max_messages=values["consume.maxMessages"],
            max_bytes=values["consume.maxBytes"],
            threshold_messages=values["consume.thresholdMessages"],
            threshold_bytes=values["consume.thresholdBytes"],
            expires=values["consume.expires"],
            idle_heartbeat=values["consume.idleHeartbeat"],
        )
    except InvalidConsumeConfig as exc:
        raise OptionError(exc.option, raw.get(exc.option, values.get(exc.option)), f"Expected {exc}.") from None
    return SourceOptions(
        connection=connection,
        stream=stream,
        subjects=values["subjects"],
        bucket=values["bucket"],
        starting=starting,
        ending_seq=values["endingOffsets"],
        ending_timestamp=values["endingTimestamp"],
        max_messages_per_trigger=values["maxMessagesPerTrigger"],
        min_messages_per_trigger=values["minMessagesPerTrigger"],
        max_trigger_delay=values["maxTriggerDelay"],
        num_partitions=values["numPartitions"] or int(_default_partitions()),
        split=values["split"],
        fail_on_data_loss=values["failOnDataLoss"],
        bookmark_consumer=values["bookmarkConsumer"],
        include_markers=values["includeMarkers"],
        batch_size=values["batchSize"],
        consume=consume,
        max_wait=values["consume.maxWait"],
        api_prefix=api_prefix(values),
    )

"""The machinery every option table uses: one option's spec, the value parsers, the table parser,
secret masking and the hints for Kafka users.

Parsing runs in three steps, as nats.go does for its consume options: every raw
string becomes a typed value checked against its own range (the parsers here);
then defaults and cross-option rules (each direction's module); then unknown keys
are refused with the nearest known name (:func:`parse_table`). It runs on the
driver when the query starts, so a typo fails ``save()`` / ``start()`` before
anything is published.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError
from ..protocol.subjects import REFUSED, is_receivable_subject, is_valid_subject
from ..protocol.ttl import InvalidTtl, parse_go_duration, resolve_ttl

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


def user_keys(raw: Mapping[str, str]) -> list[str]:
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

_STREAM_NAME_BAD = re.compile(f"[{re.escape(REFUSED)}.*>/\\\\]")


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
    """One user-facing option: how it parses and how docs/ documents it (tools/docs.py)."""

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


def parse_subject(raw: str) -> str:
    if not is_receivable_subject(raw):
        raise ValueError(raw)
    return raw


def parse_subject_filters(raw: str) -> tuple[str, ...]:
    """Comma-separated subjects; wildcards allowed (they name what a stream captures)."""
    parts = tuple(p.strip(REFUSED) for p in raw.split(","))  # ASCII blanks only: U+3000 is part of a subject
    if not parts or not all(is_valid_subject(p) for p in parts):
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


def as_fields(values: Mapping[str, Any], *names: str, group: str = "") -> dict[str, Any]:
    """The parsed ``values`` of options ``names`` (each under ``group``, such as ``'stream.'``), keyed by
    their dataclass field: the option's name in snake case (``maxPendingAcks``: ``max_pending_acks``)."""
    return {re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower(): values[group + name] for name in names}


def raw_value(raw: Mapping[str, str], name: str) -> str:
    """The value the user gave option ``name`` (any case), for an error message."""
    return next((v for k, v in raw.items() if k.lower() == name.lower()), "<set>")



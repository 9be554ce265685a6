"""ADR-43 per-message TTL: the ``Nats-TTL`` grammar, free of I/O.

Two functions matter:

* :func:`server_ttl_seconds` answers what nats-server 2.15 does with a header
  value, byte for byte (``server/stream.go parseMessageTTL``): ``never`` in any
  case, else Go's ``time.ParseDuration`` (at least 1s, truncated to whole
  seconds), else ASCII digits as seconds. The differential test holds it
  against a real server's PubAcks.
* :func:`resolve_ttl` is the connector's rule, which is the server's verdict
  except in two documented places where the connector keeps the ADR's promise:

  - a TTL of zero (``0``, ``0s``, ``0.0h``, integer 0) is *ignored* as ADR-43
    says: the row is published without ``Nats-TTL`` and lives by the stream's
    limits. nats-server 2.15 would reject ``Nats-TTL: 0`` with err_code 10165.
  - a decimal integer above 2^63-1 is rejected. The server parses digits into a
    wrapping int64, so it accepts ``18446744073709551617`` as *1 second*: a TTL
    silently cut from ~585 billion years to one second. Use ``never`` instead.
"""

from __future__ import annotations

import datetime as _dt
import math

from .headers import TTL

NEVER = "never"
"""ADR-43: ``Nats-TTL: never`` keeps the message forever, even past MaxAge."""

HEADER = TTL
"""ADR-43 header key; nats-server matches it byte-exactly and case-sensitively."""

_INT64_MAX = (1 << 63) - 1
_NS_PER_S = 1_000_000_000
_UNITS_NS = {
    b"ns": 1,
    b"us": 1_000,
    "µs".encode(): 1_000,  # U+00B5 MICRO SIGN
    "μs".encode(): 1_000,  # U+03BC GREEK SMALL LETTER MU
    b"ms": 1_000_000,
    b"s": _NS_PER_S,
    b"m": 60 * _NS_PER_S,
    b"h": 3600 * _NS_PER_S,
}


class InvalidTtl(ValueError):
    """A TTL value the server would reject (or that the connector refuses)."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"invalid TTL {value!r}: {reason}")


ALLOWED_TTL = (
    "Expected whole seconds (e.g. 3600), a Go duration of at least 1s "
    "(e.g. '90s', '1h30m', '1.5h'), 'never', or 0 for no TTL."
)


def _is_digit(c: int) -> bool:
    return 48 <= c <= 57


def parse_go_duration(text: str) -> int:
    """Go's ``time.ParseDuration`` in nanoseconds, on the UTF-8 bytes as Go sees them.

    Raises ``ValueError`` where Go returns an error (syntax, unknown unit, overflow).
    """
    s = text.encode("utf-8", "surrogatepass")
    neg = False
    if s[:1] in (b"-", b"+"):
        neg = s[:1] == b"-"
        s = s[1:]
    if s == b"0":
        return 0
    if not s:
        raise ValueError("invalid duration")
    total = 0
    limit = 1 << 63
    while s:
        if not (s[0] == 46 or _is_digit(s[0])):  # next char must be [0-9.]
            raise ValueError("invalid duration")
        # leadingInt
        i, v = 0, 0
        while i < len(s) and _is_digit(s[i]):
            if v > limit // 10:
                raise ValueError("invalid duration (overflow)")
            v = v * 10 + s[i] - 48
            if v > limit:
                raise ValueError("invalid duration (overflow)")
            i += 1
        pre = i > 0
        s = s[i:]
        # leadingFraction
        f, scale, post = 0, 1.0, False
        if s[:1] == b".":
            s = s[1:]
            i, overflow = 0, False
            while i < len(s) and _is_digit(s[i]):
                if not overflow:
                    if f > _INT64_MAX // 10:
                        overflow = True
                    else:
                        y = f * 10 + s[i] - 48
                        if y > limit:
                            overflow = True
                        else:
                            f = y
                            scale *= 10
                i += 1
            post = i > 0
            s = s[i:]
        if not pre and not post:
            raise ValueError("invalid duration")
        i = 0
        while i < len(s) and not (s[i] == 46 or _is_digit(s[i])):
            i += 1
        if i == 0:
            raise ValueError("missing unit in duration")
        unit = _UNITS_NS.get(s[:i])
        if unit is None:
            raise ValueError(f"unknown unit {s[:i].decode('utf-8', 'replace')!r} in duration")
        s = s[i:]
        if v > limit // unit:
            raise ValueError("invalid duration (overflow)")
        v *= unit
        if f > 0:
            v += int(float(f) * (float(unit) / scale))
            if v > limit:
                raise ValueError("invalid duration (overflow)")
        total += v
        if total > limit:
            raise ValueError("invalid duration (overflow)")
    if neg:
        return -total
    if total > _INT64_MAX:
        raise ValueError("invalid duration (overflow)")
    return total


def _wrapping_int64_digits(text: str) -> int:
    """nats-server ``parseInt64``: ASCII digits into a wrapping int64; -1 on anything else."""
    if not text:
        return -1
    n = 0
    for ch in text:
        if not ("0" <= ch <= "9"):
            return -1
        n = (n * 10 + ord(ch) - 48) & 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n > _INT64_MAX else n


def server_ttl_seconds(value: str) -> int | None:
    """What nats-server 2.15 makes of ``Nats-TTL: <value>``.

    Returns ``None`` when the server treats the header as absent (empty value, or
    digits that parse to 0), ``-1`` for never, else the effective whole seconds.
    Raises :class:`InvalidTtl` exactly where the PubAck carries err_code 10165.
    """
    text = value.lstrip(" ")  # the server skips spaces after "Nats-TTL:", not after the value
    if text == "":
        return None
    if text.lower() == NEVER:
        return -1
    try:
        ns = parse_go_duration(text)
    except ValueError:
        seconds = _wrapping_int64_digits(text)
        if seconds < 0:
            raise InvalidTtl(value, "not a number of seconds, a Go duration or 'never'") from None
        return seconds or None
    if ns < _NS_PER_S:
        raise InvalidTtl(value, "a duration below the 1 second minimum")
    return ns // _NS_PER_S


def resolve_ttl(value: str | int) -> str | None:
    """The ``Nats-TTL`` header value to send for a row's TTL, or ``None`` for none.

    Applies the server's grammar with the two documented deviations of the module
    docstring (zero is ignored, overflowing integers are refused). Strings are
    sent as written (minus leading spaces) because the server stores the header
    verbatim and the source gives it back as the ``ttl`` column.
    """
    if isinstance(value, bool):
        raise InvalidTtl(value, "a boolean is not a TTL")
    if isinstance(value, int):
        if value == 0:
            return None
        if value < 0:
            raise InvalidTtl(value, "negative; use 'never' for a message that never expires")
        if value > _INT64_MAX:
            raise InvalidTtl(value, "larger than 2^63-1 seconds; use 'never'")
        return str(value)
    if not isinstance(value, str):
        raise InvalidTtl(value, f"a {type(value).__name__} is not a TTL")
    text = value.lstrip(" ")
    if text.isascii() and text.isdigit():
        seconds = int(text)
        if seconds > _INT64_MAX:
            raise InvalidTtl(value, "larger than 2^63-1 seconds; use 'never'")
        return text if seconds else None
    try:
        ns = parse_go_duration(text)
    except ValueError:
        ns = None
    if ns == 0:
        return None
    if server_ttl_seconds(text) is None:  # raises InvalidTtl where the server would
        return None
    return text


def remaining_ttl_seconds(expires_at: _dt.datetime, now: _dt.datetime) -> int:
    """Whole seconds left until ``expires_at``, rounded up; <= 0 means already expired.

    Rounding up keeps the copy alive at least until the original's deadline; it
    can outlive it by under a second, never expire early.
    """
    left = (expires_at - now).total_seconds()
    return math.ceil(left) if left > 0 else 0


class TtlResolver:
    """:func:`resolve_ttl` once per distinct value: a TTL column repeats a handful of values, and
    parsing a Go duration costs a few microseconds a row. Refusals are remembered too (a new
    :class:`InvalidTtl` is raised each time); the memo is bounded."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._memo: dict[tuple[type, object], tuple[str | None, str | None]] = {}

    def __call__(self, value: str | int) -> str | None:
        key = (type(value), value)  # True == 1, but a boolean is refused and 1 is not
        try:
            hit = self._memo.get(key)
        except TypeError:  # unhashable: not a TTL either way
            return resolve_ttl(value)
        if hit is None:
            try:
                hit = (resolve_ttl(value), None)
            except InvalidTtl as exc:
                hit = (None, exc.reason)
            if len(self._memo) < self.LIMIT:
                self._memo[key] = hit
        if hit[1] is not None:
            raise InvalidTtl(value, hit[1])
        return hit[0]

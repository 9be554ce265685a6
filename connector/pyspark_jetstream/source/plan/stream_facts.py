"""The stream's facts a plan needs, asked of the server on the driver.

Planning is free of I/O (:mod:`.offsets`, :mod:`.subject_split`) except for what only the server
knows: the stream's bounds and identity (one ``STREAM.INFO``), the sequences a start or end time
names, the subjects a split by subject groups, whether a filter can match anything, and the server's
version. Each question is asked through :func:`ask_server`, which rides through a transient failure
(a leader election, a restart) for at most ``consume.maxWait``, as a partition does.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ...client import jsapi, runtime
from ...errors import JetStreamApiError, OptionError, StreamConfigError
from ...logs import get_logger
from ...options import SourceOptions
from ...protocol.subjects import intersect
from .offsets import StreamBounds, initial_seq, last_seq_at_or_before, stores_other_subjects
from .subject_split import ALL, MAX_GROUPS, choose_depth, needs_listing

log = get_logger("source")
T = TypeVar("T")


def ask_server(opts: SourceOptions, call: Callable[[], Coroutine[Any, Any, T]], what: str) -> T:
    """Run a driver-side API call, asking again while the failure is transient.

    A streaming query plans every micro-batch with a STREAM.INFO; a server restart
    or a leader election leaves that request unanswered (408) or without responders
    (503) for a few seconds. Failing the query there would force a restart from the
    checkpoint for what the partitions themselves ride through, so the driver keeps
    asking with backoff, for at most ``consume.maxWait``, like a partition does.

    The logs say what the query went through, not each try (issue #56): one WARNING when the server stops
    answering (naming it, and how long ago it last answered), one INFO when it answers again (after how long).
    """
    deadline = time.monotonic() + opts.max_wait
    delays = jsapi.retry_delays()
    servers = opts.connection.servers
    while True:
        asked = time.monotonic()
        try:
            result = runtime.run(
                call(), opts.connection.connect_timeout * 3 + 30, note_after=PATIENCE,
                on_delay=lambda asked=asked: _silent(servers, what, f"no answer within {PATIENCE:g}s", opts.max_wait,
                                                     asked))
        except JetStreamApiError as exc:
            if not jsapi.is_transient(exc):
                raise
            _silent(servers, what, exc.description, opts.max_wait, asked)
            delay = next(delays)
            if time.monotonic() + delay > deadline:
                raise JetStreamApiError(
                    exc.api, exc.code, exc.err_code,
                    f"{exc.description}; still failing after {opts.max_wait:g}s of retries (raise the option "
                    "'consume.maxWait' to wait longer for the server)",
                ) from None
            log.debug("%s failed (%s); asking again in %.2fs", what, exc, delay)
            time.sleep(delay)
            continue
        _answered(servers)
        return result


_last_answer: dict[tuple[str, ...], float] = {}  # servers -> when they last answered a planning request
_silent_since: dict[tuple[str, ...], float] = {}  # servers -> when they stopped answering (a WARNING said so)


PATIENCE = 5.0
"""Seconds a planning request may go unanswered before the WARNING says so. A healthy server answers in
milliseconds; a request sent during a short outage is answered after the reconnect and fails nothing
(issue #56: a server stopped for 10 s, one request waited 6.5 s), so a failure alone misses it."""


def _silent(servers: tuple[str, ...], what: str, why: str, max_wait: float, asked: float) -> None:
    """The first failure or long wait of an outage (asked at ``asked``: the outage counts from then)."""
    now = time.monotonic()
    if servers in _silent_since:
        return
    _silent_since[servers] = asked
    last = _last_answer.get(servers)
    log.warning("JetStream source: %s did not answer the query's planning (%s: %s)%s; waiting, and asking again, "
                "for up to %gs (option 'consume.maxWait')", ", ".join(servers), what, why,
                f", {now - last:.1f}s after its last answer" if last else "", max_wait)


def _answered(servers: tuple[str, ...]) -> None:
    now = time.monotonic()
    _last_answer[servers] = now
    since = _silent_since.pop(servers, None)
    if since is not None:
        log.info("JetStream source: %s answers again, after %.1fs", ", ".join(servers), now - since)


def with_origin(opts: SourceOptions) -> SourceOptions:
    """``opts`` for the bucket it reads as it is: a bucket that mirrors another (``mirror`` naming
    ``KV_<origin>``, local or through a domain or an API prefix) holds the origin's subjects,
    ``$KV.<origin>.<key>``, so its filters, option ``keys`` and the key column take the origin's name (a
    read by the mirror's own name found 0 rows; issue #54). A bucket that sources others stores what its
    subject transforms make, its own subjects, as nats.go sets them up: read as it is."""
    if opts.bucket is None:
        return opts

    async def info() -> dict | None:
        nc = await runtime.connection(opts.connection)
        return await jsapi.stream_info(nc, opts.stream, opts.api_prefix)

    reply = ask_server(opts, info, f"Stream info of '{opts.stream}'")
    origin = str(((reply or {}).get("config", {}).get("mirror") or {}).get("name") or "")
    return opts.mirroring(origin[3:]) if origin.startswith("KV_") and len(origin) > 3 else opts


def stream_bounds(opts: SourceOptions) -> StreamBounds:
    async def info() -> dict | None:
        nc = await runtime.connection(opts.connection)
        return await jsapi.stream_info(nc, opts.stream, opts.api_prefix)

    reply = ask_server(opts, info, f"Stream info of '{opts.stream}'")
    if reply is None:
        what = f"KV bucket '{opts.bucket}' (stream {opts.stream})" if opts.bucket else f"Stream '{opts.stream}'"
        raise StreamConfigError(f"{what} does not exist. Check the option '{'bucket' if opts.bucket else 'stream'}'.")
    if str(reply["config"].get("retention", "limits")).lower() == "workqueue":
        raise StreamConfigError(
            f"Stream '{opts.stream}' has WorkQueue retention: a message is removed once it is acknowledged, so a "
            "reader would have to remove what it reads, and a replayed micro-batch or a retried task could not "
            f"read it again (no exactly-once, and the stream's own consumers would lose it). Mirror it into a "
            f"Limits stream and read the mirror, e.g. `nats stream add {opts.stream}_COPY --mirror {opts.stream}`."
        )
    state = reply["state"]
    return StreamBounds(first_seq=int(state.get("first_seq", 0)), last_seq=int(state.get("last_seq", 0)),
                        created=reply.get("created"), max_age=int(reply["config"].get("max_age") or 0) / 1e9,
                        num_subjects=int(state.get("num_subjects") or 0),
                        subjects=tuple(reply["config"].get("subjects") or ()),
                        stores_others=stores_other_subjects(reply["config"]),
                        allow_direct=bool(reply["config"].get("allow_direct")))


def check_filters(opts: SourceOptions, bounds: StreamBounds) -> None:
    """Option ``subjects``: each filter must be able to match a subject the stream takes; one that
    cannot (a typo, a bare key on a bucket) would read nothing, and a streaming query nothing forever.
    A stream that stores subjects its config does not name (a mirror, one with sources or a subject
    transform: :func:`~.offsets.stores_other_subjects`) is not checked, and a filter matching a message
    the stream still holds (of subjects it took before its config changed) is kept."""
    if not opts.subjects or not bounds.subjects or bounds.stores_others:
        return
    dead = [f for f in opts.subjects if not any(intersect(f, s) is not None for s in bounds.subjects)]
    if not dead:
        return

    async def held() -> bool:
        nc = await runtime.connection(opts.connection)
        return await jsapi.next_message(nc, opts.stream, 1, tuple(dead), opts.api_prefix) is not None

    if ask_server(opts, held, "The lookup of messages on the option 'subjects'"):
        return
    what = f"KV bucket '{opts.bucket}'" if opts.bucket else f"stream '{opts.stream}'"
    hint = (f" A bucket's subjects are '$KV.{opts.key_bucket}.<key>': filter keys as "
            f"'{', '.join(f'$KV.{opts.key_bucket}.{d}' for d in dead)}'." if opts.bucket else "")
    raise OptionError("subjects", ",".join(opts.subjects),
                      f"{', '.join(repr(d) for d in dead)} cannot match any subject of {what}, which takes "
                      f"{', '.join(bounds.subjects)}: nothing would be read.{hint}")


def ending_seq(opts: SourceOptions, bounds: StreamBounds) -> int:
    """The last sequence of a batch read: ``endingOffsets``, or per ``endingTimestamp`` the last
    message stored at or before that time (found as ``startingTimestamp``'s first one is). Times
    compare at Spark's precision, the microsecond: a message stored within the microsecond the
    option names (its ``timestamp`` column shows that microsecond) is read."""
    if opts.ending_timestamp is None:
        return bounds.last_seq if opts.ending_seq is None else opts.ending_seq
    after = opts.ending_timestamp + dt.timedelta(microseconds=1)

    async def lookup() -> int | None:
        nc = await runtime.connection(opts.connection)
        return await jsapi.first_seq_at_or_after(nc, opts.stream, after, opts.api_prefix)

    return last_seq_at_or_before(ask_server(opts, lookup, "The end-time lookup"), bounds)


def starting_seq(opts: SourceOptions, bounds: StreamBounds) -> int:
    start = opts.starting
    if start.kind == "timestamp":
        async def lookup() -> int | None:
            nc = await runtime.connection(opts.connection)
            return await jsapi.first_seq_at_or_after(nc, opts.stream, start.value, opts.api_prefix)

        return initial_seq("timestamp", bounds, timestamp_seq=ask_server(opts, lookup, "The start-time lookup"))
    return initial_seq(start.kind, bounds, sequence=start.value)


def split_depth(opts: SourceOptions, bounds: StreamBounds, partitions: int) -> int | None:
    """How a read split by subject groups its subjects (``subject_split.choose_depth``); the subjects
    are listed only when there are more than literal filters carry."""
    listed: list[str] = []
    if bounds.num_subjects > MAX_GROUPS and partitions > 1:
        # More subjects than one listing page: listing them all would cost the planning (and every
        # partition) time that grows with the stream's subjects. One partition reads them, in order.
        log.warning("stream %s: its %d subjects are more than a split by subject lists (%d); one partition reads "
                    "them all (a copy keeps its order through a shuffle instead: docs/source.md, 'Splits').",
                    opts.stream, bounds.num_subjects, MAX_GROUPS)
        return ALL
    if needs_listing(bounds.num_subjects, partitions):
        async def listing() -> list[str]:
            nc = await runtime.connection(opts.connection)
            return (await jsapi.stream_subjects(nc, opts.stream, opts.filter_subjects, opts.api_prefix))[1]

        listed = ask_server(opts, listing, f"Listing the subjects of '{opts.stream}'")
    depth = choose_depth(len(listed) or bounds.num_subjects, partitions, listed)
    if depth == ALL and partitions > 1 and bounds.num_subjects > 1:
        log.warning("stream %s: its %d subjects cannot be grouped into consumer filters for %d partitions; one "
                    "partition reads them all to keep each subject's order (option split='sequence' reads in "
                    "parallel without that order).", opts.stream, bounds.num_subjects, partitions)
    return depth


FEW_FILTERS = 16
"""Most literal filter subjects whose message counts a read asks for (one STREAM.INFO each)."""


def few_filtered(opts: SourceOptions, limit: int) -> bool:
    """Whether the read's literal filter subjects (option ``subjects``, ``keys``) hold at most ``limit``
    messages in the whole stream, an upper bound on any range of it. Such a read is not worth splitting
    by sequence: a partition's filtered consumer cannot stop at its range's end, so each partition but
    the last is sent the matching messages past its end before it stops (a 2-partition read of one
    subject of 200 was sent 307). Wildcards, or more than :data:`FEW_FILTERS` subjects: not asked."""
    subjects = opts.subjects or ()
    if not subjects or len(subjects) > FEW_FILTERS or any(t in ("*", ">") for s in subjects for t in s.split(".")):
        return False

    async def counts() -> int:
        nc = await runtime.connection(opts.connection)
        total = 0
        for subject in subjects:
            info, _ = await jsapi.stream_subjects(nc, opts.stream, (subject,), opts.api_prefix)
            total += sum(((info or {}).get("state") or {}).get("subjects", {}).values()) if info else 0
            if total > limit:
                break
        return total

    return ask_server(opts, counts, f"Counting the messages of the option 'subjects' in '{opts.stream}'") <= limit


def require_server(opts: SourceOptions, needed: tuple[int, int], option: str, value: str, what: str) -> None:
    """Refuse, when the query starts, an option the connected nats-server is too old for."""
    async def version() -> tuple[int, int, int] | None:
        return jsapi.server_version(await runtime.connection(opts.connection))

    have = ask_server(opts, version, "Connecting")
    if have is not None and have[:2] < needed:
        raise OptionError(option, value, f"It needs nats-server {needed[0]}.{needed[1]} or newer ({what}); the "
                                         f"server is {'.'.join(map(str, have))}. Upgrade the server, or remove the "
                                         "option.")

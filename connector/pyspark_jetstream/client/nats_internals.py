"""The one module that touches nats-py's internals; everything else calls its functions.

nats-py turns every incoming message into a ``Msg`` with headers parsed into a
dict (repeated keys collapse into one value) and queues it for a task. The
source needs the raw header block (multi-valued headers round-trip intact) and
cannot afford that per message. :func:`raw_subscribe` registers a handler that
receives ``(subject, reply, payload, header_block)`` as bytes straight from the
protocol parser, before any ``Msg`` exists; the subscription itself is a normal
nats-py one, so it is re-established on reconnect. The sink writes pre-built
frames the same way (:func:`send_raw`), and both follow the connection's life
through :class:`ConnectionEvents`.

A read moves hundreds of thousands of frames a second, and nats-py's parser
awaits a coroutine per frame. :class:`FastFrames` sits in front of it: it
splits every complete MSG/HMSG frame of a raw subscription out of each buffer
the socket yields, synchronously, and hands everything else (PING, INFO,
-ERR, a frame of another subscription, a line it does not know) to nats-py's
parser exactly as nats-py would have seen it. nats-py keeps the connection.

The internals used, all of nats-py 2.x (pinned in pyproject.toml, and checked in
about a second by ``tests/unit/test_nats_internals.py`` so that an upgrade fails
there first): ``Client._process_msg``, ``Client._ps`` (its ``parse``,
``reset``, ``buf``, ``state``, ``needed`` and ``header_needed``, and the protocol regexes of
``nats.protocol.parser``, two of which :func:`receive_every_subject` replaces), ``Client._send_command``,
``Client._flush_pending``, ``Client._pending`` / ``_pending_data_size``,
``Client._server_info``, ``Client.options["max_reconnect_attempts"]`` and
``Subscription._id``; and two attributes this module sets on the client. The regex swap checks
itself when it is made (:func:`swap_problem`: real frames through nats-py's own ``Parser``) and
is left out, with one warning, when a nats-py release parses differently with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from nats.protocol import parser as _wire

from ..logs import get_logger
from .connection_events import CLOSE_POLL, ConnectionEvents, PermissionViolation  # noqa: F401  (their old home)

log = get_logger("wire")

RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]
RunHandler = Callable[[list], None]
"""Takes a list of ``(subject, reply, data, header_block)`` frames, in order."""

_HANDLERS_ATTR = "_pyspark_jetstream_raw_handlers"
_RUNS_ATTR = "_pyspark_jetstream_run_handlers"


def _unanchored(pattern: re.Pattern) -> re.Pattern:
    """nats-py's regex without its leading ``\\A``, so that ``match(buf, pos)`` anchors at ``pos``
    (``\\A`` only ever matches at the start of the whole buffer)."""
    assert pattern.pattern.startswith(b"\\A"), pattern.pattern
    return re.compile(pattern.pattern[2:], pattern.flags)


NATS_PY_MSG_RE, NATS_PY_HMSG_RE = _wire.MSG_RE, _wire.HMSG_RE
"""nats-py's own delivery-line regexes, as it ships them (the unit test holds ours to their groups)."""
_ARG = rb"([^ \t\r\n]+)"
_BLANKS = rb"[ \t]+"
MSG_RE = re.compile(rb"\AMSG" + _BLANKS + _ARG + _BLANKS + _ARG + _BLANKS + rb"(" + _ARG + _BLANKS + rb")?(\d+)\r\n")
HMSG_RE = re.compile(rb"\AHMSG" + _BLANKS + _ARG + _BLANKS + _ARG + _BLANKS + rb"(" + _ARG + _BLANKS + rb")?(\d+)"
                     + _BLANKS + rb"(\d+)\r\n")
"""MSG and HMSG lines split as nats-server splits a line's arguments (at space, tab, CR and LF only), with
nats-py's groups: (subject, sid, reply and blanks, reply, [header size,] size)."""


_SWAPPED: dict[str, bool] = {}
"""Per parser module: whether :func:`receive_every_subject` swapped its regexes in (decided once per process)."""
CHECK_CHUNK = 32 * 1024
"""The self-check feeds its frames in pieces of this size, as socket reads come (a 300 KB payload spans ten)."""


def receive_every_subject(wire: Any = _wire, version: str | None = None) -> bool:
    """Let nats-py's parser take every subject the server delivers, process-wide, if it parses as before.

    nats-py splits a delivery line at any ASCII blank (bytes ``\\s``: vertical tab and form feed too).
    The server takes both inside a subject, so a message stored under ``orders.a\\x0cb`` (any other
    client can publish one) made nats-py fail the line and drop the connection, and a read reconnect
    until its task died. Its two regexes are swapped for :data:`MSG_RE` and :data:`HMSG_RE`: every
    line the server writes parses as before, and those subjects parse too. (The sink still refuses
    to publish them: other nats-py readers cannot receive them.)

    The pin allows nats-py releases no test saw, so the swap checks itself first (:func:`swap_problem`):
    real frames through nats-py's own ``Parser``, with and without headers and with a 300 KB payload,
    must come out the same with either pair of regexes, and the swap must take effect. Otherwise the
    regexes stay as nats-py ships them, and one warning names the nats-py version and why. ``wire``:
    the parser module (tests: a stand-in). Returns whether the swap is in."""
    name = getattr(wire, "__name__", repr(wire))
    if name not in _SWAPPED:
        originals = (NATS_PY_MSG_RE, NATS_PY_HMSG_RE) if wire is _wire else (getattr(wire, "MSG_RE", None),
                                                                              getattr(wire, "HMSG_RE", None))
        problem = swap_problem(wire, originals)
        if problem is None:
            wire.MSG_RE, wire.HMSG_RE = MSG_RE, HMSG_RE
            if _parsed(wire, None, _VT_FRAME) != _VT_PARSED:  # the real parser, not a copy: took effect?
                wire.MSG_RE, wire.HMSG_RE = originals
                problem = "after the swap, nats-py's parser still cuts a subject at a vertical tab"
        if problem is not None:
            log.warning("nats-py %s: the connector leaves nats-py's MSG/HMSG regexes as they are (%s). A message "
                        "whose subject holds a vertical tab or form feed will make nats-py drop the connection; "
                        "nats-py 2.16 is the release the connector was tested with.",
                        version or _nats_py_version(), problem)
        _SWAPPED[name] = problem is None
    return _SWAPPED[name]


def _samples() -> bytes:
    """Delivery frames as nats-server writes them (a JetStream ack reply, an inbox, headers, 300 KB payloads),
    built when the check runs, not at import."""
    headers = b"NATS/1.0\r\nA: b\r\nA: c\r\n\r\n"
    big = bytes(range(256)) * (300 * 1024 // 256)
    h = len(headers)
    return b"".join([
        b"MSG orders.a 1 5\r\nhello\r\n",
        b"MSG orders.a 2 _INBOX.x.y 5\r\nhello\r\n",
        b"MSG orders.a 3 0\r\n\r\n",
        b"HMSG orders.b 4 $JS.ACK.S.C.1.2.3.4.5 %d %d\r\n%shello\r\n" % (h, h + 5, headers),
        b"HMSG orders.b 5 %d %d\r\n%s\r\n" % (h, h, headers),
        b"MSG orders.big 6 r %d\r\n%s\r\n" % (len(big), big),
        b"HMSG orders.big 7 %d %d\r\n%s%s\r\n" % (h, h + len(big), headers, big),
        b"PING\r\n",
    ])


_VT_FRAME = b"MSG orders.a\x0bb 8 5\r\nhello\r\n"
_VT_PARSED = [("msg", 8, b"orders.a\x0bb", b"", b"hello", None)]


def swap_problem(wire: Any, originals: tuple[Any, Any]) -> str | None:
    """Why swapping :data:`MSG_RE`/:data:`HMSG_RE` into the parser module ``wire`` would be wrong, or None.

    ``originals``: the module's own regexes. Parses :func:`_samples` through ``wire.Parser`` with each
    pair, through a copy of its ``parse`` that looks the names up in a copy of the module's globals
    (nothing process-wide changes while checking), and compares what the parser hands its client."""
    parse = getattr(getattr(wire, "Parser", None), "parse", None)
    names = getattr(getattr(parse, "__code__", None), "co_names", ())
    if not all(isinstance(p, re.Pattern) for p in originals) or not {"MSG_RE", "HMSG_RE"} <= set(names):
        return "its parser no longer looks up the module's MSG_RE and HMSG_RE"
    samples = _samples()
    theirs, ours = _parsed(wire, originals, samples), _parsed(wire, (MSG_RE, HMSG_RE), samples)
    if ours != theirs:
        return f"real frames parse differently with the swapped regexes: {_first_difference(theirs, ours)}"
    if _parsed(wire, (MSG_RE, HMSG_RE), _VT_FRAME) != _VT_PARSED:
        return "the swapped regexes do not reach its parser (a subject with a vertical tab is still cut)"
    return None


class _Recorder:
    """The client a self-check's parser hands its frames to."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> None:
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), bytes(data), headers))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_info(self, info: Any) -> None:
        self.calls.append(("info", info))

    async def _process_err(self, err: Any) -> None:
        self.calls.append(("err", err))


def _parsed(wire: Any, regexes: tuple[Any, Any] | None, data: bytes) -> list | str:
    """What ``wire.Parser`` hands its client for ``data`` fed in :data:`CHECK_CHUNK` pieces (or the error it
    raises): with ``regexes`` through a copy of ``parse`` seeing them as the module's, with None as it is."""
    import types

    parse = wire.Parser.parse
    if regexes is not None:
        scope = {**parse.__globals__, "MSG_RE": regexes[0], "HMSG_RE": regexes[1]}
        parse = types.FunctionType(parse.__code__, scope, parse.__name__, parse.__defaults__, parse.__closure__)
    client = _Recorder()
    parser = wire.Parser(client)
    try:
        for k in range(0, len(data), CHECK_CHUNK):
            step = parse(parser, data[k:k + CHECK_CHUNK])
            try:
                step.send(None)  # the recorder never suspends: the coroutine ends in one step
            except StopIteration:
                continue
            step.close()
            return "the parser awaited something other than its client"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return client.calls


def _first_difference(theirs: list | str, ours: list | str) -> str:
    if isinstance(theirs, str) or isinstance(ours, str):
        return f"nats-py's own gives {str(theirs)[:120]!r}, the swapped {str(ours)[:120]!r}"
    for k, (a, b) in enumerate(zip(theirs, ours, strict=False)):
        if a != b:
            return f"frame {k}: {str(a)[:120]!r} against {str(b)[:120]!r}"
    return f"{len(theirs)} frames against {len(ours)}"


def _nats_py_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nats-py")
    except PackageNotFoundError:  # pragma: no cover - vendored copies
        return "(version unknown)"


_MSG = _unanchored(MSG_RE)
_HMSG = _unanchored(HMSG_RE)
_LINES = tuple(_unanchored(p) for p in (_wire.OK_RE, _wire.ERR_RE, _wire.PING_RE, _wire.PONG_RE, _wire.INFO_RE))
"""The other operations, in the order nats-py's parser tries them (after MSG and HMSG)."""
_ERR = _LINES[1]


LARGE_FRAME = 256 * 1024
"""A frame this long that a read cuts is gathered by nats-py: carried here, it would be copied once
per socket read (32 KiB)."""


class FastFrames:
    """nats-py's ``parse`` with the raw subscriptions' data frames split out in one synchronous pass.

    Equivalence with nats-py's parser, which the differential unit test checks on
    random byte streams cut at random points, rests on three rules:

    - a frame is recognised with nats-py's own regexes, tried in nats-py's order, and cut
      with nats-py's slicing (a header size past the frame's own is left to nats-py);
    - anything handed to nats-py is handed whole: a complete frame or line it will
      consume exactly (a regex that matches a buffer matches the same bytes of any
      prefix that still holds them), or, for a line no regex knows, the whole rest,
      after which nats-py parses alone until its buffer is empty again;
    - what is incomplete is kept here until more bytes come, where nats-py would
      also wait without acting (a large frame is handed to nats-py, which is then
      given exactly the bytes that finish it); a ``reset`` (reconnect, stale
      connection) drops it and ends the pass, as it empties nats-py's buffer mid-loop.

    Consecutive frames of a subscription registered with a run handler are handed over together, as one
    list, after the buffer's pass: the reader then decides its next pull once per socket read, not per message.
    """

    __slots__ = ("parser", "handlers", "runs", "original_parse", "original_reset", "carry", "generation", "large",
                 "on_err_line")

    def __init__(self, parser: Any, handlers: dict[int, RawHandler], runs: dict[int, RunHandler],
                 on_err_line: Callable[[str], None] | None = None) -> None:
        self.parser = parser
        self.on_err_line = on_err_line  # takes each -ERR text as the server wrote it (nats-py lower-cases it)
        self.handlers = handlers
        self.runs = runs
        self.original_parse = parser.parse
        self.original_reset = parser.reset
        self.carry = b""
        self.generation = 0
        self.large = LARGE_FRAME
        parser.parse = self.parse
        parser.reset = self.reset

    def reset(self) -> None:
        self.carry = b""
        self.generation += 1
        self.original_reset()

    async def parse(self, data: bytes = b"") -> None:
        parser = self.parser
        generation = self.generation
        if parser.buf or parser.state != _wire.AWAITING_CONTROL_LINE:
            # nats-py is inside something it was handed. Inside a payload it gets exactly the bytes that
            # finish it (it then acts on that frame alone, as it would have), unless the frame's header
            # size runs past it (nats-py would read the bytes after it as headers); anything else it
            # finishes alone.
            missing = parser.needed + 2 - len(parser.buf)
            if (parser.state != _wire.AWAITING_MSG_PAYLOAD or parser.header_needed > parser.needed
                    or not 0 < missing < len(data)):
                await self.original_parse(data)
                return
            await self.original_parse(data[:missing])
            if self.generation != generation:
                return
            data = data[missing:]
        buf = self.carry + data if self.carry else bytes(data)
        self.carry = b""
        pos = 0
        while True:
            pos, stop = self._split(buf, pos)
            if stop == 0:
                return
            await self.original_parse(buf[pos:] if stop < 0 else buf[pos:stop])
            if stop < 0 or self.generation != generation:  # alone from here on, or reset meanwhile
                return
            pos = stop

    def _split(self, buf: bytes, pos: int) -> tuple[int, int]:
        """Deliver the raw subscriptions' complete frames from ``pos`` on, synchronously, until one
        that is not theirs. Returns ``(pos, stop)``: ``stop`` 0 when all of ``buf`` was taken (a
        frame still coming kept in ``carry``), else nats-py parses ``buf[pos:stop]`` next (all the
        rest, alone, when ``stop`` is -1)."""
        handlers, runs = self.handlers, self.runs
        run: list[tuple] = []
        run_sid = -1
        run_sid_text = None  # the sid as the frames of the current run spell it (skips parsing it again)
        end = len(buf)
        find = buf.find
        try:
            while pos < end:
                hsize = 0
                # A line in a server's exact form (single spaces, sizes in digits): the regex's tokens, no regex.
                eol = find(b"\r\n", pos)
                head = buf[pos:eol] if eol > 0 else b""
                parts = head.split()
                n = len(parts)
                if 4 <= n <= 5 and parts[0] == b"MSG" and parts[-1].isdigit() and b" ".join(parts) == head:
                    m, subject, sid, size, reply = parts, parts[1], parts[2], parts[-1], parts[3] if n == 5 else None
                elif (n == 6 and parts[0] == b"HMSG" and parts[4].isdigit() and parts[5].isdigit()
                      and b" ".join(parts) == head):
                    _, subject, sid, reply, hsize, size = m = parts
                    hsize = int(hsize)
                elif buf[pos] != 72:  # not 'H': only MSG's regex can match here (HMSG's starts with 'H')
                    m = _MSG.match(buf, pos)
                    if m is not None:
                        subject, sid, _, reply, size = m.groups()
                else:  # and only HMSG's (MSG's starts with 'M'): one regex tried, not two
                    m = _HMSG.match(buf, pos)
                    if m is not None:
                        subject, sid, _, reply, hsize, size = m.groups()
                        hsize = int(hsize)
                if m is None:
                    for line in _LINES:
                        m = line.match(buf, pos)
                        if m is not None:
                            if line is _ERR and self.on_err_line is not None and m.group(1):
                                self.on_err_line(m.group(1).decode(errors="replace").strip("'"))
                            return pos, m.end()
                    if b"\r\n" in buf[pos:]:  # nats-py raises, or waits with a long buffer
                        return pos, -1
                    self.carry = buf[pos:]  # a line still coming
                    return pos, 0
                in_run = sid == run_sid_text  # a frame of the run under way: its sid is known good
                if not in_run:
                    text = sid
                    try:
                        sid = int(sid)
                    except ValueError:  # nats-py says 'malformed MSG'
                        return pos, -1
                start = eol + 2 if m is parts else m.end()
                needed = int(size)
                if hsize > needed:  # headers longer than the frame (no server sends it): nats-py's to parse
                    return pos, -1
                stop = start + needed + 2
                if stop > end:  # the payload is still coming
                    if stop - pos > self.large:
                        return pos, -1  # nats-py gathers it (in a bytearray, not by copies of a growing carry)
                    self.carry = buf[pos:]
                    return pos, 0
                if hsize > 0:
                    frame = (subject, reply or b"", buf[start + hsize:start + needed], buf[start:start + hsize])
                else:
                    frame = (subject, reply or b"", buf[start:start + needed], None)
                if in_run:
                    run.append(frame)
                    pos = stop
                    continue
                handler = handlers.get(sid)
                if handler is None:
                    return pos, stop
                if sid in runs:
                    if sid != run_sid:
                        self._deliver(run_sid, run)
                        run, run_sid = [], sid
                    run_sid_text = text
                    run.append(frame)
                else:
                    self._deliver(run_sid, run)
                    run, run_sid, run_sid_text = [], -1, None
                    _call(handler, *frame)
                pos = stop
            return pos, 0
        finally:
            self._deliver(run_sid, run)

    def _deliver(self, sid: int, run: list[tuple]) -> None:
        if run:
            _call(self.runs[sid], run)


def _call(handler: Callable[..., None], *args: Any) -> None:
    """Run a raw handler on nats-py's read loop, where an exception would stop the loop for every
    user of the connection: it is logged, and what the handler was given is dropped."""
    try:
        handler(*args)
    except Exception:
        log.error("a raw frame handler raised; what it was given was dropped", exc_info=True)


def _install(nc: Any) -> dict[int, RawHandler]:
    handlers = getattr(nc, _HANDLERS_ATTR, None)
    if handlers is not None:
        return handlers
    receive_every_subject()
    handlers = {}
    original = nc._process_msg

    async def dispatch(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        handler = handlers.get(sid)
        if handler is None:
            await original(sid, subject, reply, data, headers)
            return
        _call(handler, subject, reply, data, headers)

    nc._process_msg = dispatch  # frames nats-py's parser still parses (after a line FastFrames leaves to it)
    runs: dict[int, RunHandler] = {}
    FastFrames(nc._ps, handlers, runs, lambda text: events_of(nc).note_err_line(text))
    setattr(nc, _RUNS_ATTR, runs)
    setattr(nc, _HANDLERS_ATTR, handlers)
    return handlers


async def raw_subscribe(nc: Any, subject: str, handler: RawHandler, run: RunHandler | None = None) -> Any:
    """Subscribe ``subject`` with a synchronous raw ``handler``; returns the nats-py Subscription.
    With ``run``, consecutive frames split out of one socket read go to ``run`` as one list
    (``handler`` still takes any frame nats-py's own parser delivers)."""
    handlers = _install(nc)

    async def never_called(msg: Any) -> None:  # frames go to the raw handler instead
        return None

    sub = await nc.subscribe(subject, cb=never_called)
    handlers[sub._id] = handler
    if run is not None:
        getattr(nc, _RUNS_ATTR)[sub._id] = run
    return sub


async def raw_unsubscribe(nc: Any, sub: Any) -> None:
    getattr(nc, _HANDLERS_ATTR, {}).pop(sub._id, None)
    getattr(nc, _RUNS_ATTR, {}).pop(sub._id, None)
    if not nc.is_closed:
        await sub.unsubscribe()


_EVENTS_ATTR = "_pyspark_jetstream_events"


def events_of(nc: Any) -> ConnectionEvents:
    """The :class:`ConnectionEvents` of ``nc`` (created on first use for a client opened elsewhere)."""
    events = getattr(nc, _EVENTS_ATTR, None)
    if events is None:
        events = ConnectionEvents()
        setattr(nc, _EVENTS_ATTR, events)
    return events


def adopt(nc: Any, events: ConnectionEvents) -> None:
    """Make ``nc``, connected with ``events.callbacks()``, a long-lived shared connection:
    reconnect without limit from now on (the first connect was bounded), report its close
    even when nats-py's callback never comes, and let :func:`events_of` find ``events``."""
    nc.options["max_reconnect_attempts"] = -1
    events.watch(nc)
    setattr(nc, _EVENTS_ATTR, events)
    _install(nc)  # FastFrames reads every -ERR first, in the server's own case (PermissionViolation)


async def send_raw(nc: Any, frame: bytes) -> None:
    """Queue protocol bytes and kick nats-py's flusher."""
    await nc._send_command(frame)
    await nc._flush_pending()


def is_clustered(nc: Any) -> bool:
    """Whether the connected server is part of a cluster (its INFO names one)."""
    return bool((getattr(nc, "_server_info", None) or {}).get("cluster"))


def still_pending(nc: Any, buffers: list[bytes]) -> list[bytes]:
    """Those of ``buffers`` (objects handed to :func:`send_raw`) that nats-py has not written yet.

    While the connection is down nats-py keeps them and writes them after the
    reconnect, which may be long after the task that sent them has failed."""
    pending = {id(b) for b in nc._pending}
    return [b for b in buffers if id(b) in pending]


def discard_pending(nc: Any, buffers: list[bytes]) -> int:
    """Drop ``buffers`` from nats-py's write buffer if still there; how many were dropped."""
    ids = {id(b) for b in buffers}
    kept = [b for b in nc._pending if id(b) not in ids]
    dropped = len(nc._pending) - len(kept)
    if dropped:
        nc._pending = kept
        nc._pending_data_size = sum(len(b) for b in kept)
    return dropped


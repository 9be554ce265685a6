"""Every nats-py internal that client/nats_internals.py relies on, with the shape it relies on.

Runs in about a second without a server, so that a nats-py upgrade that renames or
reshapes one fails here first, naming it, instead of somewhere in the integration run.
And the rule that keeps it true: no other module of the package touches a private
attribute of a nats-py object.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import nats.aio.client
import nats.aio.subscription
import nats.protocol.parser

from pyspark_jetstream.client import nats_internals

PACKAGE = Path(nats_internals.__file__).resolve().parents[1]
Client = nats.aio.client.Client


def _params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_raw_message_hook_has_the_parser_signature():
    # nats_internals.raw_subscribe replaces the bound _process_msg and calls the original.
    assert inspect.iscoroutinefunction(Client._process_msg)
    assert _params(Client._process_msg) == ["self", "sid", "subject", "reply", "data", "headers"]
    # The parser calls it through the client attribute (so the replacement is what runs).
    parser_source = inspect.getsource(nats.aio.client) + inspect.getsource(__import__("nats.protocol.parser",
                                                                                      fromlist=["x"]))
    assert "_process_msg(" in parser_source


def test_raw_sends_go_through_the_write_buffer_as_the_same_objects():
    assert inspect.iscoroutinefunction(Client._send_command) and inspect.iscoroutinefunction(Client._flush_pending)
    assert _params(Client._send_command)[:2] == ["self", "cmd"]
    client = Client()
    client.options["pending_size"] = 1 << 20
    frame = b"PUB x 0\r\n\r\n"
    asyncio.run(client._send_command(frame))
    # still_pending / discard_pending find frames in _pending by identity and fix _pending_data_size.
    assert client._pending == [frame] and client._pending[0] is frame
    assert client._pending_data_size == len(frame)


def test_attributes_read_or_set_on_the_client():
    client = Client()
    assert isinstance(client._server_info, dict)  # is_clustered reads its "cluster"
    assert isinstance(client.options, dict)  # adopt sets options["max_reconnect_attempts"]
    assert "max_reconnect_attempts" in _params(Client.connect)
    assert 'self.options["max_reconnect_attempts"]' in inspect.getsource(Client)
    assert client.last_error is None and client.is_closed is False  # public, read by ConnectionEvents
    client._pyspark_jetstream_events = object()  # the client takes attributes of ours (no __slots__)
    for callback in ("disconnected_cb", "reconnected_cb", "closed_cb", "error_cb"):
        assert callback in _params(Client.connect), callback


def test_a_subscription_keeps_its_sid_in_id():
    sub = nats.aio.subscription.Subscription(Client(), id=7, subject="a")
    assert sub._id == 7  # raw handlers are keyed by the sid the parser passes to _process_msg


NATS_OBJECTS = re.compile(r"\b(nc|self\.nc|self\._nc|client|sub|self\.sub|old)\._[a-z]")


def test_no_other_module_touches_a_private_nats_py_attribute():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "nats_internals.py" or "tools" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if NATS_OBJECTS.search(line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


NATS_PRIVATE_MODULES = re.compile(r"\bnats\.(protocol|aio)\b|from nats import (protocol|aio)\b")


def test_no_other_module_imports_nats_pys_private_modules():
    """nats-py's parser and client modules (its wire protocol, its Client's internals) belong to
    client/nats_internals.py alone (issue #47): a nats-py upgrade is then checked in one place."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "nats_internals.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if NATS_PRIVATE_MODULES.search(line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_parser_the_fast_frame_path_sits_in_front_of():
    import nats.protocol.parser as wire

    client = Client()
    parser = client._ps
    assert isinstance(parser, wire.Parser)
    # The read loop and every reset go through the attribute (so FastFrames' instance attributes run).
    source = inspect.getsource(Client)
    assert "await self._ps.parse(b)" in source and "self._ps.reset()" in source
    assert inspect.iscoroutinefunction(wire.Parser.parse) and _params(wire.Parser.parse) == ["self", "data"]
    assert parser.buf == bytearray() and parser.state == wire.AWAITING_CONTROL_LINE
    assert parser.needed == 0 and parser.header_needed == 0  # what a payload still lacks, and its header size
    asyncio.run(parser.parse(b"HMSG s 1 12 15\r\nNATS"))
    assert (parser.state, parser.needed, parser.header_needed, bytes(parser.buf)) == \
        (wire.AWAITING_MSG_PAYLOAD, 15, 12, b"NATS")
    # The regexes it recognises frames with, in the order the parser tries them, each anchored by \A.
    order = re.findall(r"(\w+_RE)\.match\(self\.buf\)", inspect.getsource(wire.Parser.parse))
    assert order == ["MSG_RE", "HMSG_RE", "OK_RE", "ERR_RE", "PING_RE", "PONG_RE", "INFO_RE"]
    for name in order:
        assert getattr(wire, name).pattern.startswith(b"\\A"), name
    # FastFrames tries one of the two by the first byte: MSG's begins with 'M', HMSG's with 'H', case and all.
    assert wire.MSG_RE.pattern.startswith(b"\\AMSG") and wire.HMSG_RE.pattern.startswith(b"\\AHMSG")
    assert not (wire.MSG_RE.flags | wire.HMSG_RE.flags) & re.IGNORECASE
    # The parser calls its client with these (the differential test's recorder has the same).
    for hook, params in (("_process_err", ["self", "err_msg"]), ("_process_ping", ["self"]),
                         ("_process_pong", ["self"]), ("_process_info", ["self", "info"])):
        assert _params(getattr(Client, hook))[:len(params)] == params, hook


def test_the_delivery_regexes_swapped_in_keep_nats_pys_groups():
    """nats-py's MSG/HMSG regexes split at VT and FF (bytes ``\\s``), which the server takes inside a
    subject; ours split where the server does and give nats-py's groups on every line it writes."""
    from pyspark_jetstream.client.nats_internals import (
        HMSG_RE,
        MSG_RE,
        NATS_PY_HMSG_RE,
        NATS_PY_MSG_RE,
    )

    lines = [b"MSG a.b 1 12\r\n", b"MSG a.b 1 _INBOX.x 12\r\n", b"MSG\ta  1\t r  5\r\n", b"MSG a 1\r\n",
             b"HMSG a.b 12 $JS.ACK.S.C.1.2.3.4.5 30 40\r\n", b"HMSG a 1 3 4\r\n", b"HMSG a 1 x 4\r\n",
             b"MSG \xe6\x9d\xb1.\xc2\xa0 3 r 0\r\n"]
    for line in lines:
        for ours, theirs in ((MSG_RE, NATS_PY_MSG_RE), (HMSG_RE, NATS_PY_HMSG_RE)):
            a, b = ours.match(line), theirs.match(line)
            assert (a and a.groups()) == (b and b.groups()), line
    for line in (b"MSG a\x0cb 1 3\r\n", b"MSG a\x0bb 1 r\x0c 3\r\n"):  # why they are swapped: the subject is cut
        theirs = NATS_PY_MSG_RE.match(line)
        assert theirs is None or theirs.group(1) == b"a", line
    assert MSG_RE.match(b"MSG a\x0bb 1 r\x0c 3\r\n").groups() == (b"a\x0bb", b"1", b"r\x0c ", b"r\x0c", b"3")
    assert HMSG_RE.match(b"HMSG a\x0cb 1 2 3\r\n").group(1) == b"a\x0cb"


# The swap checks itself (issue #47): the pin allows nats-py releases no test saw.

class _Client:
    """What nats-py's parser hands its client, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def _process_msg(self, sid, subject, reply, data, headers):
        self.calls.append((sid, bytes(subject), bytes(reply), bytes(data), headers))

    async def _process_ping(self):
        self.calls.append(("ping",))


def _parse(data: bytes, chunk: int = 32 * 1024) -> list[tuple] | str:
    """nats-py's own Parser, as the process has it now, fed ``data`` in socket-sized pieces."""
    client = _Client()
    parser = nats.protocol.parser.Parser(client)

    async def feed():
        for k in range(0, len(data), chunk):
            await parser.parse(data[k:k + chunk])

    try:
        asyncio.run(feed())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return client.calls


def _frames() -> bytes:
    headers = b"NATS/1.0\r\nA: b\r\nA: c\r\n\r\n"
    big = bytes(range(256)) * 1200  # 300 KB
    return b"".join([b"MSG o.a 1 5\r\nhello\r\n", b"MSG o.a 2 _INBOX.r 5\r\nhello\r\n",
                     b"HMSG o.b 3 $JS.ACK.S.C.1.2.3.4.5 %d %d\r\n%shello\r\n" % (len(headers), len(headers) + 5,
                                                                                  headers),
                     b"MSG o.big 4 %d\r\n%s\r\n" % (len(big), big),
                     b"HMSG o.big 5 r %d %d\r\n%s%s\r\n" % (len(headers), len(headers) + len(big), headers, big),
                     b"PING\r\n"])


def test_the_swap_parses_real_frames_as_nats_py_does_and_takes_effect():
    """Against the installed nats-py: its own Parser, regexes swapped, gives what it gave before on frames with
    and without headers and 300 KB payloads, and a subject with a vertical tab now comes through whole."""
    wire = nats.protocol.parser
    swapped = (wire.MSG_RE, wire.HMSG_RE)
    wire.MSG_RE, wire.HMSG_RE = nats_internals.NATS_PY_MSG_RE, nats_internals.NATS_PY_HMSG_RE
    try:
        before = _parse(_frames())
        assert isinstance(before, list) and len(before) == 6 and before[3][3][:3] == bytes(range(3))
        assert _parse(b"MSG o.a\x0bb 9 5\r\nhello\r\n").startswith("ProtocolError")  # why it is swapped
    finally:
        wire.MSG_RE, wire.HMSG_RE = swapped
    assert nats_internals.swap_problem(wire, (nats_internals.NATS_PY_MSG_RE, nats_internals.NATS_PY_HMSG_RE)) is None
    assert nats_internals.receive_every_subject() is True
    assert _parse(_frames()) == before
    assert _parse(b"MSG o.a\x0bb 9 5\r\nhello\r\n") == [(9, b"o.a\x0bb", b"", b"hello", None)]


def _stand_in(name: str, *edits: tuple[str, str]):
    """nats-py's parser module as a later release might ship it: its source with ``edits`` made (each found once)."""
    import types

    source = inspect.getsource(nats.protocol.parser)
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


OTHER_GROUPS = (  # MSG's reply group made non-capturing: four groups, and the parser unpacks four
    ('MSG_RE = re.compile(b"\\\\AMSG\\\\s+([^\\\\s]+)\\\\s+([^\\\\s]+)\\\\s+(([^\\\\s]+)',
     'MSG_RE = re.compile(b"\\\\AMSG\\\\s+([^\\\\s]+)\\\\s+([^\\\\s]+)\\\\s+(?:([^\\\\s]+)'),
    ("subject, sid, _, reply, needed_bytes = msg.groups()", "subject, sid, reply, needed_bytes = msg.groups()"),
)


def test_a_nats_py_whose_groups_differ_keeps_its_regexes_and_says_so_once(caplog):
    wire = _stand_in("standin_other_groups", *OTHER_GROUPS)
    theirs = wire.MSG_RE
    assert theirs.groups == 4 and nats_internals.MSG_RE.groups == 5
    with caplog.at_level("WARNING", logger="pyspark_jetstream"):
        assert nats_internals.receive_every_subject(wire, version="9.9.9") is False
        assert nats_internals.receive_every_subject(wire, version="9.9.9") is False
    assert wire.MSG_RE is theirs  # not swapped
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "nats-py 9.9.9" in warnings[0] and "parse differently" in warnings[0], warnings


def test_a_nats_py_that_binds_its_regexes_elsewhere_is_not_swapped(caplog):
    wire = _stand_in("standin_bound_elsewhere",
                     ("        self.nc = nc\n", "        self.nc = nc\n        self.msg_re, self.hmsg_re = MSG_RE, HMSG_RE\n"),
                     ("msg = MSG_RE.match(self.buf)", "msg = self.msg_re.match(self.buf)"),
                     ("msg = HMSG_RE.match(self.buf)", "msg = self.hmsg_re.match(self.buf)"))
    theirs = wire.MSG_RE, wire.HMSG_RE
    with caplog.at_level("WARNING", logger="pyspark_jetstream"):
        assert nats_internals.receive_every_subject(wire, version="9.9.8") is False
    assert theirs == (wire.MSG_RE, wire.HMSG_RE)
    assert "nats-py 9.9.8" in caplog.text and "no longer looks up" in caplog.text

"""Permission violations are matched to subjects case-sensitively (issue #23).

nats-py lower-cases every -ERR text, the subject in it included, so :class:`FastFrames`
takes the text off the wire first, in the server's case; a violation for ``Orders.x``
is then never taken for one about ``orders.x``. No server: the parser is nats-py's,
fed bytes; the publisher is never started.
"""

from __future__ import annotations

import asyncio

from nats.protocol.parser import Parser

from pyspark_jetstream.client.nats_internals import ConnectionEvents, FastFrames, PermissionViolation
from pyspark_jetstream.sink.publish.publisher import Publisher

ERR = b"-ERR 'Permissions Violation for Publish to \"Orders.x\"'\r\n"


class Client:
    """What nats-py's parser calls on its client; -ERR goes where nats-py's client sends it."""

    def __init__(self, events: ConnectionEvents) -> None:
        self.events = events
        self._ps = Parser(self)

    async def _process_err(self, text: str) -> None:
        self.events.on_error(Exception(f"nats: {text.strip(chr(39))}"))  # nats-py's own wording

    async def _process_ping(self) -> None:
        return None


def violation_from_the_wire(fast: bool) -> tuple[ConnectionEvents, list]:
    events, seen = ConnectionEvents(), []

    class Listener:
        def on_permission_error(self, violation):
            seen.append(violation)

    events.listeners.add(Listener())
    client = Client(events)
    if fast:
        FastFrames(client._ps, {}, {}, events.note_err_line)
    asyncio.run(client._ps.parse(b"PING\r\n" + ERR))
    return events, seen


def test_the_violation_keeps_the_servers_case_and_names_only_that_subject():
    events, seen = violation_from_the_wire(fast=True)
    assert seen == [PermissionViolation('Permissions Violation for Publish to "Orders.x"', exact=True)]
    assert events.permission_error_for("Orders.x") == 'Permissions Violation for Publish to "Orders.x"'
    assert events.permission_error_for("orders.x") is None
    assert events.permission_error_for("ORDERS.X") is None


def test_a_text_only_nats_py_read_is_matched_without_case():
    # nats-py's parser alone (no FastFrames in front): only its lower-cased copy exists.
    events, seen = violation_from_the_wire(fast=False)
    assert seen == [PermissionViolation('permissions violation for publish to "orders.x"', exact=False)]
    assert events.permission_error_for("Orders.x") is not None


def test_a_publisher_fails_only_the_frames_of_the_refused_subject():
    class NoServer:
        _server_info: dict = {}

    pub = Publisher(NoServer(), max_pending=8, ack_timeout=5.0)
    pub.reply_prefix = "_INBOX.abc."
    for position, subject in enumerate(["orders.x", "Orders.x", "orders.x", "ORDERS.x"]):
        pub.window.inflight[str(position)] = (position, b"frame", subject, None, None, 0, 0)
    pub.on_permission_error(PermissionViolation('Permissions Violation for Publish to "Orders.x"', exact=True))
    assert [(f.position, f.code) for f in pub.failures] == [(1, 403)]
    assert sorted(pub.window.inflight) == ["0", "2", "3"]
    pub.on_permission_error(PermissionViolation('Permissions Violation for Subscription to "_INBOX.abc.*"', exact=True))
    assert sorted(f.position for f in pub.failures) == [0, 1, 2, 3]  # no PubAck can come for any of them

"""Fast-ingest batches (ADR-50), the protocol alone: reply subjects, the server's answers, the flow window.

The answers are written as nats-server 2.15 writes them (server/stream.go, jetstream_batching.go):
``BatchFlowAck``/``Gap``/``Err`` as JSON with ``type``, the final PubAck with ``batch`` and ``count``
appended, error PubAcks as ``JSPubAckResponse`` (``error`` first, then the PubAck's ``stream``/``seq``).
"""

from __future__ import annotations

import random

import pytest

from pyspark_jetstream.protocol.fast_ingest import (
    DONE,
    FATAL,
    OP_APPEND,
    OP_COMMIT,
    OP_PING,
    OP_START,
    REFUSED,
    RESUME,
    RETRY,
    ApiError,
    BatchAck,
    BatchError,
    BatchReplies,
    FlowAck,
    FlowErr,
    FlowGap,
    FlowWindow,
    op_for,
    parse_reply,
    split_reply_subject,
)

ACK = b'{"type":"ack","seq":%d,"msgs":%d}'
UNKNOWN = b'{"error":{"code":400,"err_code":10208,"description":"batch publish ID unknown"},"stream":"S","seq":0}'
TOO_MANY = b'{"error":{"code":429,"err_code":10211,"description":"batch publish too many inflight"},"stream":"S","seq":0}'
DISABLED = b'{"error":{"code":400,"err_code":10205,"description":"batch publish is disabled"},"stream":"S","seq":0}'
TTL_OFF = b'{"error":{"code":400,"err_code":10166,"description":"per-message TTL is disabled"},"stream":"S","seq":0}'


def test_reply_subjects_carry_the_batch_the_mode_and_the_operation():
    replies = BatchReplies("_INBOX.abc", "b1", flow=100)
    assert replies.subject(1, OP_START) == "_INBOX.abc.b1.100.fail.1.0.$FI"
    assert replies.for_message(7, 9) == "_INBOX.abc.b1.100.fail.7.1.$FI"
    assert replies.for_message(9, 9) == "_INBOX.abc.b1.100.fail.9.2.$FI"
    assert replies.ping(42) == "_INBOX.abc.b1.100.fail.42.4.$FI"
    assert replies.listen == "_INBOX.abc.b1.>"
    assert [op_for(k, 3) for k in (1, 2, 3)] == [OP_START, OP_APPEND, OP_COMMIT]
    assert op_for(1, 1) == OP_COMMIT  # a one-message batch commits at once (start + commit-eob is refused)
    assert OP_PING == 4


@pytest.mark.parametrize("batch_id", ["", "a.b", "a b", "*", ">", "x" * 65])
def test_a_batch_id_is_one_short_subject_token(batch_id):
    with pytest.raises(ValueError):
        BatchReplies("_INBOX.x", batch_id)


@pytest.mark.parametrize("flow", [0, 65_536])
def test_the_flow_is_a_uint16_above_zero(flow):
    with pytest.raises(ValueError):
        BatchReplies("_INBOX.x", "b", flow=flow)


def test_an_answers_subject_names_its_batch_and_message():
    replies = BatchReplies("_INBOX.abc", "b1", flow=100)
    assert split_reply_subject(replies.for_message(12, 20), "_INBOX.abc") == ("b1", 12)
    assert split_reply_subject(replies.ping(3), "_INBOX.abc") == ("b1", 3)
    assert split_reply_subject("_INBOX.other.b1.100.fail.12.1.$FI", "_INBOX.abc") is None
    assert split_reply_subject("_INBOX.abc.12", "_INBOX.abc") is None


def test_the_servers_answers_are_told_apart_by_their_keys():
    assert parse_reply(ACK % (0, 500)) == FlowAck(0, 500)
    assert parse_reply(b'{"type":"gap","last_seq":10,"seq":15}') == FlowGap(10, 15)
    err = b'{"type":"err","seq":10,"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 1"}}'
    assert parse_reply(err) == FlowErr(10, ApiError(400, 10071, "wrong last sequence: 1"))
    final = b'{"stream":"S","seq":1234,"batch":"b1","count":200}'
    assert parse_reply(final) == BatchAck("S", 1234, 200, "b1")
    duplicate = b'{"stream":"S","seq":5,"duplicate": true,"batch":"b1","count":1}'
    assert parse_reply(duplicate) == BatchAck("S", 5, 1, "b1", duplicate=True)
    # An error PubAck carries the stream too: the error decides.
    assert parse_reply(UNKNOWN, at=7) == BatchError(7, ApiError(400, 10208, "batch publish ID unknown"))
    # A stream named "ack" or "err" is free text: it never makes a flow message.
    assert parse_reply(b'{"stream":"ack","seq":3,"batch":"b","count":3}') == BatchAck("ack", 3, 3, "b")


def test_a_status_or_an_unreadable_answer_is_an_error_never_a_success():
    no_responders = parse_reply(b"", b"NATS/1.0 503\r\n\r\n", at=1)
    assert no_responders.no_responders and no_responders.about_batch and no_responders.at == 1
    for data in (b"nonsense", b"[]", b'{"type":"ack","seq":-1,"msgs":5}', b'{"type":"ack"}', b'{"seq":3}'):
        reply = parse_reply(data, at=4)
        assert isinstance(reply, BatchError) and reply.error.code == 0 and not reply.about_batch, data


def test_error_pubacks_say_whether_they_are_about_the_batch():
    assert parse_reply(UNKNOWN).unknown_batch
    assert parse_reply(TOO_MANY).too_many
    assert parse_reply(DISABLED).about_batch and not parse_reply(DISABLED).too_many
    assert not parse_reply(TTL_OFF).about_batch


def _started(total: int, every: int = 10) -> FlowWindow:
    window = FlowWindow(total).sending(1).on_reply(FlowAck(0, every))
    return window


def test_message_1_goes_alone_then_the_window_is_two_flow_intervals():
    window = FlowWindow(100)
    assert window.limit() == 1
    window = window.sending(1)
    assert window.limit() == 1  # waiting for the server's first answer
    window = window.on_reply(FlowAck(0, 10))
    assert (window.acked, window.every, window.limit()) == (0, 10, 20)
    window = window.sending(20).on_reply(FlowAck(10, 10))
    assert (window.acked, window.limit()) == (10, 30)
    with pytest.raises(ValueError):
        window.sending(31)
    assert FlowWindow(1).limit() == 1 and FlowWindow(100, outstanding=3).sending(1).on_reply(
        FlowAck(0, 10)).limit() == 30


def test_flow_acks_are_cumulative_and_a_repeated_one_moves_nothing():
    window = _started(100).sending(20).on_reply(FlowAck(20, 10))  # the ack of 10 was lost: implied
    assert window.acked == 20
    # A new stream leader re-sends the ack of its last stored message, with its own interval.
    window = window.sending(40).on_reply(FlowAck(20, 1))
    assert (window.acked, window.every, window.repeats, window.limit()) == (20, 1, 1, 40)
    assert window.on_reply(FlowAck(10, 5)).acked == 20  # never backwards
    assert window.on_reply(FlowAck(99, 10)).acked == 40  # never past what was sent


def test_a_gap_stops_sending_and_the_final_puback_says_where_to_resume():
    window = _started(100).sending(20).on_reply(FlowAck(10, 10)).on_reply(FlowGap(14, 16))
    assert window.stopped and window.limit() == 20 and window.final is None
    end = window.on_reply(BatchAck("S", 513, 13, "b")).end()
    assert (end.kind, end.stored, end.resume_from, end.in_doubt, end.stream_seq) == (RESUME, 13, 14, 0, 513)


def test_a_refused_message_ends_the_batch_before_it():
    window = _started(100).sending(20).on_reply(FlowErr(12, ApiError(400, 10071, "wrong last sequence: 3")))
    assert window.stopped and window.limit() == 20
    end = window.on_reply(BatchAck("S", 40, 11, "b")).end()
    assert (end.kind, end.stored, end.refused, end.error.err_code) == (REFUSED, 11, 12, 10071)


def test_a_refusal_before_the_batch_checks_is_settled_by_the_gap_after_it():
    # A size limit refuses message 5 with an error PubAck; the batch goes on, message 6 makes a gap.
    window = _started(100).sending(8).on_reply(BatchError(5, ApiError(400, 10054, "message size exceeds")))
    assert window.stopped and window.final is None
    window = window.on_reply(FlowGap(5, 6)).on_reply(BatchAck("S", 4, 4, "b"))
    end = window.end()
    assert (end.kind, end.stored, end.refused) == (REFUSED, 4, 5)


def test_an_unknown_batch_resumes_from_the_last_flow_ack_with_the_rest_in_doubt():
    window = _started(100).sending(20).on_reply(FlowAck(10, 10)).on_reply(BatchError(21, parse_reply(UNKNOWN).error))
    end = window.end()
    assert (end.kind, end.stored, end.resume_from, end.in_doubt) == (RESUME, 10, 11, 10)
    # Every message in flight then gets its own 10208: the batch is over, they change nothing.
    assert window.on_reply(BatchError(22, parse_reply(UNKNOWN).error)) == window


def test_too_many_batches_is_retried_and_a_disabled_stream_is_fatal():
    retry = FlowWindow(100).sending(1).on_reply(parse_reply(TOO_MANY, at=1)).end()
    assert (retry.kind, retry.stored, retry.resume_from) == (RETRY, 0, 1)
    fatal = FlowWindow(100).sending(1).on_reply(parse_reply(DISABLED, at=1)).end()
    assert (fatal.kind, fatal.error.err_code) == (FATAL, 10205)
    refused = FlowWindow(100).sending(1).on_reply(parse_reply(TTL_OFF, at=1)).end()
    assert (refused.kind, refused.refused, refused.stored, refused.error.err_code) == (REFUSED, 1, 0, 10166)


def test_a_one_message_batch_gets_its_puback_at_once():
    window = FlowWindow(1).sending(1)
    assert window.on_reply(BatchAck("S", 9, 1, "b")).end() == window.on_reply(BatchAck("S", 9, 1, "b")).end()
    end = window.on_reply(BatchAck("S", 9, 1, "b", duplicate=True)).end()
    assert (end.kind, end.stored, end.stream_seq) == (DONE, 1, 9)
    with pytest.raises(ValueError):
        window.end()


class _FailModeStream:
    """nats-server's fail-mode bookkeeping, reduced to what a client can observe: acks every ``every``
    stored messages, a gap ends the batch, a message id seen before is skipped but counted."""

    def __init__(self, every: int) -> None:
        self.every, self.stored, self.ids, self.batches = every, [], set(), {}

    def receive(self, batch: str, k: int, msg_id: int, commit: bool) -> list:
        state = self.batches.get(batch)
        if state is None:
            if k != 1:
                return [BatchError(k, ApiError(400, 10208, "batch publish ID unknown"))]
            state = self.batches[batch] = {"lseq": 0, "fseq": 0, "done": False}
        if state["done"]:
            return []
        answers = [FlowAck(0, self.every)] if k == 1 and not commit else []
        if k != state["lseq"] + 1:
            state["done"] = True
            return answers + [FlowGap(state["lseq"] + 1, k), BatchAck("S", len(self.stored), state["lseq"], batch)]
        state["lseq"] = k
        if msg_id not in self.ids:
            self.ids.add(msg_id)
            self.stored.append(msg_id)
        if commit:
            state["done"] = True
            return answers + [BatchAck("S", len(self.stored), k, batch)]
        if k - state["fseq"] >= self.every:
            state["fseq"] = k
            answers.append(FlowAck(k, self.every))
        return answers


@pytest.mark.parametrize("seed", range(30))
def test_resuming_where_each_end_says_stores_every_message_once_in_order(seed):
    """Messages are lost at random on their way (a reconnect), batches forgotten (an R1 restart):
    driven only by the window, every message ends up stored once, in order."""
    rng = random.Random(seed)
    total, server = 300, _FailModeStream(every=rng.choice((1, 7, 50)))
    position, batches = 0, 0
    while position < total:
        batches += 1
        assert batches < 200
        batch, n = f"b{batches}", total - position
        window = FlowWindow(n)
        while window.final is None:
            upto = window.limit()
            answers = []
            for k in range(window.sent + 1, upto + 1):
                if rng.random() < 0.01:
                    continue  # lost on the way
                if rng.random() < 0.003:
                    server.batches.pop(batch, None)  # the server forgot the batch
                answers += server.receive(batch, k, position + k - 1, k == n)
            window = window.sending(upto)
            for answer in answers:
                window = window.on_reply(answer)
            if upto == window.sent and not answers and window.final is None:
                # Silence: a ping names the highest sent; the server answers with a gap and the PubAck.
                state = server.batches.get(batch)
                if state is None:
                    window = window.on_reply(BatchError(upto, ApiError(400, 10208, "batch publish ID unknown")))
                elif not state["done"]:
                    state["done"] = True
                    window = window.on_reply(BatchAck("S", len(server.stored), state["lseq"], batch))
        end = window.end()
        assert end.kind in (DONE, RESUME), end
        position += n if end.kind == DONE else end.resume_from - 1
    assert server.stored == list(range(total))


def test_rows_in_doubt_are_resent_only_with_their_message_id():
    """A batch that ends with rows in doubt (an unknown batch) resends them from the last flow ack: the
    server drops a copy only by its ``Nats-Msg-Id``, so a row without one fails the publish instead."""
    from pyspark_jetstream.client.fast_publisher import Feed, check_resend
    from pyspark_jetstream.errors import JetStreamConnectorError

    feed = Feed()
    feed.add([(b"", b"", b"")] * 4, ["s"] * 4, ["a", "b", None, "d"])
    check_resend(feed, 0, 2)  # a and b: their ids drop what was stored
    check_resend(feed, 3, 1)
    check_resend(feed, 2, 0)  # nothing in doubt
    with pytest.raises(JetStreamConnectorError, match="message 2 has no Nats-Msg-Id"):
        check_resend(feed, 1, 2)

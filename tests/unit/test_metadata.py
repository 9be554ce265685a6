import pytest

from pyspark_jetstream.protocol.ack_subject import (
    AckMetadata,
    NotAnAckSubject,
    fast_fields,
    parse_ack_subject,
)


def test_v1_subject():
    reply = "$JS.ACK.PULL.c01.1.5.3.1795300244041189227.2"
    assert parse_ack_subject(reply) == AckMetadata("PULL", "c01", 1, 5, 3, 1795300244041189227, 2)
    assert fast_fields(reply.encode()) == (5, 3, 1795300244041189227, 2)


def test_v2_subject_with_domain_and_extra_tokens():
    reply = "$JS.ACK._.szMpdrwD.V2.c.1.7.4.1795300506960805976.0"
    meta = parse_ack_subject(reply)
    assert meta == AckMetadata("V2", "c", 1, 7, 4, 1795300506960805976, 0, None)
    assert fast_fields(reply.encode()) == (7, 4, 1795300506960805976, 0)
    longer = "$JS.ACK.hub.acc.S.c.2.8.9.100.3.tok.more"
    assert parse_ack_subject(longer).domain == "hub"
    assert fast_fields(longer.encode()) == (8, 9, 100, 3)


@pytest.mark.parametrize("reply", ["", "_INBOX.x.y", "$JS.ACK.S.c.1.2.3.4", "$JS.ACK.a.b.S.c.1.2.3.4", "$JS.ACK.S.c.x.2.3.4.5"])
def test_rejects_non_ack_subjects(reply):
    with pytest.raises(NotAnAckSubject):
        parse_ack_subject(reply)

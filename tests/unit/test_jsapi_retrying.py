"""The "not yet" policy of JetStream API look-ups (``client/jsapi.retrying``): pure logic, no server.

An election answers nothing (a timeout) or 503 (10008, or no responders) for a while; such a call is
asked again until its deadline, each attempt's wait kept within the deadline. A refusal with any other
code is the answer, at once. docs/guarantees.md, "Not yet answers".
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pyspark_jetstream.client import jsapi
from pyspark_jetstream.errors import JetStreamApiError


def answers(*outcomes):
    """A call that gives each outcome in turn (an exception is raised), recording the timeouts it got."""
    asked: list[float] = []

    async def call(timeout: float):
        asked.append(timeout)
        outcome = outcomes[len(asked) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return call, asked


@pytest.fixture(autouse=True)
def quick_delays(monkeypatch):
    monkeypatch.setattr(jsapi, "retry_delays", lambda: iter([0.01] * 100))


def test_an_election_is_asked_again_until_it_answers():
    busy = JetStreamApiError("STREAM.MSG.GET.S", 503, 10008, "JetStream system temporarily unavailable")
    call, asked = answers(asyncio.TimeoutError(), busy, JetStreamApiError("X", 503, 0, "no responders"), "the message")
    assert asyncio.run(jsapi.retrying(call, time.monotonic() + 30, timeout=10)) == "the message"
    assert len(asked) == 4 and all(t == 10 for t in asked)


def test_a_refusal_is_the_answer_at_once():
    gone = JetStreamApiError("STREAM.MSG.GET.S", 404, 10059, "stream not found")
    call, asked = answers(asyncio.TimeoutError(), gone, "never asked")
    with pytest.raises(JetStreamApiError) as caught:
        asyncio.run(jsapi.retrying(call, time.monotonic() + 30))
    assert caught.value is gone and len(asked) == 2


def test_the_deadline_ends_the_asking_with_the_last_answer_and_bounds_each_wait():
    busy = [JetStreamApiError("STREAM.MSG.GET.S", 503, 10008, f"unavailable {i}") for i in range(100)]
    call, asked = answers(*busy)
    started = time.monotonic()
    with pytest.raises(JetStreamApiError) as caught:
        asyncio.run(jsapi.retrying(call, started + 0.3, timeout=10))
    assert time.monotonic() - started < 5
    assert caught.value is busy[len(asked) - 1] and len(asked) > 3
    assert max(asked) <= 1.0  # each wait within the deadline (at least a second)

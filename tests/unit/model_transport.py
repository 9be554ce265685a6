"""What the fault-schedule harnesses' models of a stream share (tests/unit/fast_ingest_model.py,
tests/unit/per_row_model.py): the :class:`~pyspark_jetstream.client.transport.Transport` around the model (one
inbox, one subscription for the answers, the listeners told of a reconnect, never a buffer to take back) and
the reading of the frames a publisher sends."""

from __future__ import annotations

from typing import Any

from pyspark_jetstream.client.transport import Transport


class ModelTransport(Transport):
    """A model's transport. The model (a dataclass) has ``is_clustered``, ``stopped``, ``sent_after_stop``,
    ``_handler`` and ``_listeners``, and takes each frame sent in ``_arrive(subject, reply, block, payload)``;
    ``answers_in_runs``: its answers go to the subscription's run handler rather than one at a time."""

    answers_in_runs = False

    def new_inbox(self) -> str:
        return "_INBOX.model"

    async def subscribe(self, subject: str, answer: Any, answers: Any) -> Any:
        self._handler = answers if self.answers_in_runs else answer
        return "sub"

    async def unsubscribe(self, handle: Any) -> None:
        self._handler = None

    async def send(self, buffer: bytes) -> None:
        if self.stopped:
            self.sent_after_stop += 1
        self._on_send(buffer)
        for subject, reply, block, payload in frames_in(buffer):
            self._arrive(subject, reply, block, payload)

    def _on_send(self, buffer: bytes) -> None:
        """Before the frames of ``buffer`` arrive (the model records them, or refuses them)."""

    def _arrive(self, subject: str, reply: str, block: bytes, payload: bytes) -> None:
        raise NotImplementedError

    def take_back(self) -> int:
        return 0  # nothing waits in a buffer: a frame sent arrived (or was lost)

    @property
    def closed(self) -> bool:
        return False

    @property
    def clustered(self) -> bool:
        return self.is_clustered

    def watch(self, listener: Any) -> None:
        self._listeners.add(listener)

    def unwatch(self, listener: Any) -> None:
        self._listeners.discard(listener)


def header(block: bytes, name: str) -> str | None:
    for line in block.decode().split("\r\n"):
        if line.startswith(f"{name}: "):
            return line[len(name) + 2:]
    return None


def frames_in(buffer: bytes):
    """(subject, reply, header block, payload) of each PUB/HPUB frame in ``buffer``."""
    while buffer:
        line, _, rest = buffer.partition(b"\r\n")
        parts = line.decode().split(" ")
        if parts[0] == "HPUB":
            _, subject, reply, hlen, tlen = parts
            hlen, tlen = int(hlen), int(tlen)
            yield subject, reply, rest[:hlen], rest[hlen:tlen]
        else:
            _, subject, reply, tlen = parts
            hlen, tlen = 0, int(tlen)
            yield subject, reply, b"", rest[:tlen]
        buffer = rest[tlen + 2:]

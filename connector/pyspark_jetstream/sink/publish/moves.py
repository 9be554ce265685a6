"""Moving stored messages: a copy deleted, and its frame made ready to go out again under a new id.

Both repairs of a subject's order need it: the publisher's ordered recovery after a leader change
(:mod:`.recovery`) and a retried attempt putting rows behind the one its predecessor left missing
(:mod:`.retry_order`). The server would take a frame sent again under its old ``Nats-Msg-Id`` for a
duplicate of the deleted copy, so a moved frame gets :func:`~pyspark_jetstream.sink.encode.msg_ids.moved_id`, numbered per
attempt (``move_base``) and per recovery round. A target that denies deletes keeps its copy where it
is: counted, never stored twice.

:class:`Moves` is one part of :class:`~pyspark_jetstream.sink.publish.publisher.Publisher`.
"""

from __future__ import annotations

import asyncio
import time

from ...errors import JetStreamConnectorError
from ...protocol.headers import EXPECTED_LAST_SUBJECT_SEQUENCE
from ..encode.msg_ids import moved_id

_CONDITIONAL = f"\r\n{EXPECTED_LAST_SUBJECT_SEQUENCE}:".encode()


def is_conditional(sent: tuple) -> bool:
    """Whether a frame (OutFrame layout) expects its subject's last sequence (a compare-and-set)."""
    frame, header_len, payload_len = sent[1], sent[5], sent[6]
    end = len(frame) - 2 - payload_len
    return _CONDITIONAL in frame[end - header_len:end]


class Moves:
    """Deleting stored copies and renaming frames (module docstring)."""

    # Moved copies are numbered from here (``:o<move_base + round>``): a retried attempt numbers its own
    # apart from its predecessors' (retry_order), whose copies it may delete while the server still
    # remembers their ids.
    _move_base = 0

    def moved_copy(self, sent: tuple) -> tuple:
        """``sent`` (OutFrame layout) under this attempt's own moved id (``:o<move_base>``): a retried attempt
        publishes it behind a row its predecessor left missing, then deletes the copy stored ahead
        (:meth:`delete_stored`, :mod:`.retry_order`)."""
        return self._renamed(sent, self._move_base)

    async def delete_stored(self, seqs: list[int]) -> int:
        """Delete the messages at ``seqs`` of the target (no erase), asked again while it has no leader; how
        many it would not delete (``deny_delete``)."""
        refused = 0
        for i in range(0, len(seqs), 256):  # a few hundred requests at a time
            kept = await asyncio.gather(*(self._delete(seq) for seq in seqs[i:i + 256]))
            refused += sum(1 for deleted in kept if not deleted)
        return refused

    async def _move(self, frames: list) -> tuple[list[str], dict[str, int]]:
        """Delete the stored copies of ``frames`` (:class:`.reorder.Stored`) and make them ready to send again
        under a new id: (their tokens, their first send numbers). A copy the stream will not delete stays."""
        again, first_sends = [], {}
        for frame in frames:
            entry = self._stored_recent.pop(frame.token)
            if entry[4] is None:  # a subject's mark (recovery._stored_behind): stored in its place, never moved
                continue
            if self._tops is not None and not await self._still_there(frame.seq):
                continue  # a retry's duplicate of a copy its predecessor moved already: that copy stands in order
            deleted = await self._delete(frame.seq)
            if not deleted and not self._bucket:
                self.left_out_of_order += 1  # the stream keeps it where it is: counted, never stored twice
                continue
            self.stored -= 1
            self.reordered += 1
            self._inflight[frame.token] = self._renamed(entry[4])
            again.append(frame.token)
            first_sends[frame.token] = entry[0]
        return again, first_sends

    async def _still_there(self, seq: int) -> bool:
        """Whether the target holds a message at ``seq``. A retried attempt's duplicate names the sequence its
        predecessor's copy was first stored at; a leader-change repair of the predecessor may have deleted that
        copy and stored the row again under a moved id (in its order): moving it once more would store it twice.
        Asked again while the stream has no leader, up to ``ackTimeout``."""
        from ...client import jsapi

        still = await jsapi.retrying(
            lambda timeout: jsapi.next_message(self._nc, self._stream, seq, prefix=self._api_prefix, timeout=timeout),
            deadline=time.monotonic() + self._ack_timeout)
        return still is not None and still.seq == seq

    async def _delete(self, seq: int) -> bool:
        from ...client import jsapi
        from ...errors import JetStreamApiError

        for attempt in range(20):
            try:
                await jsapi.request(self._nc, f"STREAM.MSG.DELETE.{self._stream}", {"seq": seq, "no_erase": True},
                                    prefix=self._api_prefix)
                return True
            except JetStreamApiError as exc:
                if not jsapi.is_transient(exc):
                    # Denied (deny_delete), or gone already: a delete whose reply was lost did happen.
                    return not await self._still_there(seq)
                await asyncio.sleep(min(0.1 * (attempt + 1), 1.0))  # a leader being elected: ask again
        raise JetStreamConnectorError(f"Could not delete message {seq} of stream '{self._stream}' to put it back in "
                                      "its subject's order after a leader change: the stream answered no delete.")

    def _renamed(self, sent: tuple, number: int | None = None) -> tuple:
        """``sent`` under a new id (:func:`~pyspark_jetstream.sink.encode.msg_ids.moved_id`, numbered ``number``,
        else by this round): its stored copy was deleted (or is to be), and the server would take the old id
        for a duplicate."""
        from ...protocol.frames import hpub_frame, parse_hpub_frame

        position, frame, subject, ttl, msg_id, _, payload_len = sent[:7]
        _, block, payload = parse_hpub_frame(frame)
        new_id = moved_id(msg_id, self._move_base + self._rounds if number is None else number)
        block = block.replace(f"Nats-Msg-Id: {msg_id}\r\n".encode(), f"Nats-Msg-Id: {new_id}\r\n".encode(), 1)
        new_frame = hpub_frame(subject, f"{self.reply_prefix}{position}", block, payload)
        return (position, new_frame, subject, ttl, new_id, len(block), payload_len, *sent[7:])

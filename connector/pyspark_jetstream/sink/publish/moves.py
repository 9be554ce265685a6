"""Moving stored messages: a frame sent again under a new id, its old copy deleted once the new one is stored.

Both repairs of a subject's order need it: the publisher's ordered recovery after a leader change
(:mod:`.recovery`) and a retried attempt putting rows behind the one its predecessor left missing
(:mod:`.retry_order`). The server would take a frame sent again under its old ``Nats-Msg-Id`` for a
duplicate of the old copy, so a moved frame gets :func:`~pyspark_jetstream.sink.encode.msg_ids.moved_id`, numbered per
attempt (``move_base``) and per recovery round. A target that denies deletes keeps its copy where it
is: counted, never stored twice.

:class:`Mover` is one part of :class:`~pyspark_jetstream.sink.publish.publisher.Publisher` (``pub.mover``): it owns
the attempt's ``move_base``, the old copies waiting for their moved copy's PubAck (``replaced``), and the
counts of what it moved. It reads and deletes messages of the target; which frames to move, and when, is
the ordered recovery's (:mod:`.recovery`) or the retried attempt's (:mod:`.retry_order`).
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


class Mover:
    """Deleting stored copies and renaming frames (module docstring)."""

    def __init__(self, nc, stream: str | None, api_prefix: str, bucket: bool, ack_timeout: float,
                 move_base: int = 0) -> None:
        self._nc, self._stream, self._api_prefix, self._bucket = nc, stream, api_prefix, bucket
        self._ack_timeout = ack_timeout
        # Moved copies are numbered from here (``:o<move_base + round>``): a retried attempt numbers its own
        # apart from its predecessors' (retry_order), whose copies it may delete while the server still
        # remembers their ids.
        self.move_base = move_base
        self.replaced: dict[str, list[int]] = {}  # token -> old copies to delete once its moved copy is stored
        self._deny_delete: bool | None = None  # the target's deny_delete, asked before the first move
        self.reordered = 0  # messages deleted and published again in their subject's order
        self.moves_finished = 0  # old copies deleted whose moved copy an earlier attempt had stored
        self.left_out_of_order = 0  # ... that the stream would not let the sink delete

    async def delete_stored(self, seqs: list[int]) -> int:
        """Delete the messages at ``seqs`` of the target (no erase), asked again while it has no leader; how
        many it would not delete (``deny_delete``)."""
        refused = 0
        for i in range(0, len(seqs), 256):  # a few hundred requests at a time
            kept = await asyncio.gather(*(self._delete(seq) for seq in seqs[i:i + 256]))
            refused += sum(1 for deleted in kept if not deleted)
        return refused

    async def move(self, frames: list[tuple[str, int, tuple]], reply_prefix: str, round_no: int,
                   delete_first: bool = False) -> list[tuple[str, tuple, int]]:
        """Make the stored frames ``frames`` (token, the sequence it is stored at, its remembered entry: send no,
        position, subject, seq, sent) ready to send again under a new id (round ``round_no``): (token, the renamed
        frame, its first send number) for each to send. Their old copies are deleted only once the new ones are
        acknowledged (:meth:`delete_replaced`): a task that dies in between leaves a row stored twice, which its
        retry sorts out (:meth:`finish_moves`), never a row lost. ``delete_first``: a compare-and-set repair, whose
        frame expects its subject's last sequence, so the copies stored ahead of it must go before it is sent
        (:func:`.reorder.in_place`; docs/guarantees.md says why nothing is lost). A stream that denies deletes
        keeps its copies where they are: counted, never stored twice."""
        out = []
        denied = bool(frames) and await self._deletes_denied()
        for token, seq, entry in frames:
            if entry[4] is None:  # a subject's mark (recovery._stored_behind): stored in its place, never moved
                continue
            if denied and not self._bucket:
                self.left_out_of_order += 1  # the stream keeps it where it is: counted, never stored twice
                continue
            if delete_first and not denied:
                if not await self._delete(seq) and not self._bucket:
                    self.left_out_of_order += 1
                    continue
            elif not denied:
                self.replaced.setdefault(token, []).append(seq)  # deleted once the new copy is stored
            self.reordered += 1
            out.append((token, self.renamed(entry[4], reply_prefix, round_no), entry[0]))
        return out

    async def delete_replaced(self, inflight: dict, refused_positions: set[int]) -> None:
        """Delete the old copies of the moved frames whose new copy is acknowledged (no longer in ``inflight``). A
        new copy the server refused (``refused_positions``) leaves its old one where it is: a row is never left
        with no copy."""
        done = [token for token in self.replaced if token not in inflight]
        if not done:
            return
        seqs = []
        for token in done:
            old = self.replaced.pop(token)
            if int(token) not in refused_positions:
                seqs.extend(old)
        if seqs:
            self.left_out_of_order += await self.delete_stored(seqs)

    def keep_refused(self, token: str) -> bool:
        """Whether ``token`` is a moved copy whose old copy still stands (deleted only once the new one is
        stored): one the stream refused (a per-subject limit, say: both copies count until the delete) is not a
        refused row. Its old copy stays where it is, counted among the rows left out of order, never a dead
        letter or a failure while the row is stored (issue #54)."""
        if self.replaced.pop(token, None) is None:
            return False
        self.reordered -= 1
        self.left_out_of_order += 1
        return True

    async def _deletes_denied(self) -> bool:
        """Whether the target denies deletes (``deny_delete``), asked once: a move publishes its new copy before it
        deletes the old one, so it must know beforehand that the delete will be allowed."""
        if self._deny_delete is None:
            from ...client import jsapi

            info = await jsapi.retrying(
                lambda timeout: jsapi.stream_info(self._nc, self._stream, self._api_prefix, timeout),
                deadline=time.monotonic() + self._ack_timeout)
            self._deny_delete = bool(((info or {}).get("config") or {}).get("deny_delete", False))
        return self._deny_delete

    async def finish_moves(self, entries: dict[str, tuple]) -> tuple[dict[str, int], list[str]]:
        """A retried attempt: the remembered frames ``entries`` (token -> send no, position, subject, seq, sent)
        whose sequence a duplicate PubAck gave (a copy an earlier attempt stored), checked in the target.

        For each, a moved copy of the row (``<id>:o<n>``, the newest) an earlier attempt stored stands for it: its
        old copies still there are deleted (that move was cut short after its new copy was stored) and the frame
        is taken as stored there. With no moved copy and its own copy gone (a move cut short before its new copy
        was stored, or a compare-and-set repair's delete), the duplicate does not count. Returns (token -> the
        sequence of the moved copy that stands for it, the tokens whose row has no copy left)."""
        from ..encode.msg_ids import base_id
        from ..records import replay_guard

        copies = await replay_guard.moved_copies(self._nc, self._stream, self._api_prefix,
                                                 min(e[3] for e in entries.values()),
                                                 {base_id(e[4][4]) for e in entries.values()}, self._ack_timeout)
        present = await asyncio.gather(*(self._still_there(e[3]) for e in entries.values()))
        stale, lost, standing = [], [], {}
        for (token, entry), there in zip(entries.items(), present, strict=True):
            moved = sorted(copies.get(base_id(entry[4][4]), ()))
            if moved:
                stale.extend(moved[:-1] + ([entry[3]] if there else []))
                standing[token] = moved[-1]
                self.moves_finished += 1
            elif not there:
                lost.append(token)
        if stale:
            self.left_out_of_order += await self.delete_stored(stale)
        return standing, lost

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

    def renamed(self, sent: tuple, reply_prefix: str, round_no: int = 0) -> tuple:
        """``sent`` (OutFrame layout) under a new id (:func:`~pyspark_jetstream.sink.encode.msg_ids.moved_id`,
        numbered ``move_base + round_no``; round 0 is a retried attempt's own, :mod:`.retry_order`): its stored
        copy was deleted (or is to be), and the server would take the old id for a duplicate."""
        from ...protocol.frames import hpub_frame, parse_hpub_frame

        position, frame, subject, ttl, msg_id, _, payload_len = sent[:7]
        _, block, payload = parse_hpub_frame(frame)
        new_id = moved_id(msg_id, self.move_base + round_no)
        block = block.replace(f"Nats-Msg-Id: {msg_id}\r\n".encode(), f"Nats-Msg-Id: {new_id}\r\n".encode(), 1)
        new_frame = hpub_frame(subject, f"{reply_prefix}{position}", block, payload)
        return (position, new_frame, subject, ttl, new_id, len(block), payload_len, *sent[7:])

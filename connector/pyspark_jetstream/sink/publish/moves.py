"""Moving stored messages: a frame sent again under a new id, its old copy deleted once the new one is stored.

Both repairs of a subject's order need it: the publisher's ordered recovery after a leader change
(:mod:`.recovery`) and a retried attempt putting rows behind the one its predecessor left missing
(:mod:`.retry_order`). The server would take a frame sent again under its old ``Nats-Msg-Id`` for a
duplicate of the old copy, so a moved frame gets :func:`~pyspark_jetstream.sink.encode.msg_ids.moved_id`, numbered per
attempt (``move_base``) and per recovery round. A target that denies deletes keeps its copy where it
is: counted, never stored twice.

:class:`Moves` is one part of :class:`~pyspark_jetstream.sink.publish.publisher.Publisher`.
"""

from __future__ import annotations

import asyncio
import collections
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

    async def _move(self, frames: list, delete_first: bool = False) -> tuple[list[str], dict[str, int]]:
        """Make the stored frames ``frames`` (:class:`.reorder.Stored`) ready to send again under a new id: (their
        tokens, their first send numbers). Their old copies are deleted only once the new ones are acknowledged
        (:meth:`_delete_replaced`): a task that dies in between leaves a row stored twice, which its retry sorts
        out (:meth:`_check_duplicates`), never a row lost. ``delete_first``: a compare-and-set repair, whose frame
        expects its subject's last sequence, so the copies stored ahead of it must go before it is sent
        (:func:`.reorder.in_place`; docs/guarantees.md says why nothing is lost). A stream that denies deletes
        keeps its copies where they are: counted, never stored twice."""
        again, first_sends = [], {}
        denied = bool(frames) and await self._deletes_denied()
        for frame in frames:
            entry = self._stored_recent.pop(frame.token)
            self._dup_tokens.discard(frame.token)
            if entry[4] is None:  # a subject's mark (recovery._stored_behind): stored in its place, never moved
                continue
            if denied and not self._bucket:
                self.left_out_of_order += 1  # the stream keeps it where it is: counted, never stored twice
                continue
            if delete_first and not denied:
                if not await self._delete(frame.seq) and not self._bucket:
                    self.left_out_of_order += 1
                    continue
            elif not denied:
                self._replaced.setdefault(frame.token, []).append(frame.seq)  # deleted once the new copy is stored
            self.stored -= 1
            self.reordered += 1
            self._inflight[frame.token] = self._renamed(entry[4])
            again.append(frame.token)
            first_sends[frame.token] = entry[0]
        return again, first_sends

    async def _delete_replaced(self) -> None:
        """Delete the old copies of the moved frames whose new copy is acknowledged (no longer in flight). A new
        copy the server refused leaves its old one where it is: a row is never left with no copy."""
        done = [token for token in self._replaced if token not in self._inflight]
        if not done:
            return
        refused_positions = {f.position for f in self.failures if not f.dead_letter}
        seqs = []
        for token in done:
            old = self._replaced.pop(token)
            if int(token) not in refused_positions:
                seqs.extend(old)
        if seqs:
            self.left_out_of_order += await self.delete_stored(seqs)

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

    async def _check_duplicates(self, flagged: set[str]) -> bool:
        """A retried attempt (``_tops``): the remembered frames whose sequence a duplicate PubAck gave (a copy an
        earlier attempt stored) that are to move (``flagged``), or all of them when the replay records told this
        attempt what was stored (``_verify_dups``: a duplicate then names a copy the records did not find).

        For each, a moved copy of the row (``<id>:o<n>``, the newest) an earlier attempt stored stands for it: its
        old copies still there are deleted (that move was cut short after its new copy was stored) and the frame
        is taken as stored there. With no moved copy and its own copy gone (a move cut short before its new copy
        was stored, or a compare-and-set repair's delete), the duplicate does not count: the row is sent again
        under a moved id. Whether rows went out again (their answers come before the order check)."""
        suspects = [t for t in self._dup_tokens if t in self._stored_recent and (self._verify_dups or t in flagged)]
        if not suspects:
            return False
        from ..encode.msg_ids import base_id
        from ..records import replay_guard

        self._dup_tokens.difference_update(suspects)
        entries = {t: self._stored_recent[t] for t in suspects}
        copies = await replay_guard.moved_copies(self._nc, self._stream, self._api_prefix,
                                                 min(e[3] for e in entries.values()),
                                                 {base_id(e[4][4]) for e in entries.values()}, self._ack_timeout)
        present = await asyncio.gather(*(self._still_there(e[3]) for e in entries.values()))
        stale, lost = [], []
        for (token, entry), there in zip(entries.items(), present, strict=True):
            moved = sorted(copies.get(base_id(entry[4][4]), ()))
            if moved:
                stale.extend(moved[:-1] + ([entry[3]] if there else []))
                self._stored_recent[token] = (*entry[:3], moved[-1], entry[4])
                self.moves_finished += 1
            elif not there:
                lost.append(token)
        if stale:
            self.left_out_of_order += await self.delete_stored(stale)
        if not lost:
            return False
        self._rounds += 1
        lost.sort(key=lambda t: self._stored_recent[t][1])
        first_sends = {}
        for token in lost:
            entry = self._stored_recent.pop(token)
            self._inflight[token] = self._renamed(entry[4])
            first_sends[token] = entry[0]
        self.duplicates -= len(lost)  # the server's "duplicate" named a copy that is gone: not stored
        self.restored += len(lost)
        await self._send_again(lost, first_sends)
        return True

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

    async def _send_again(self, tokens: list[str], first_sends: dict[str, int] | None = None) -> None:
        """Send ``tokens`` again, in this order. Unanswered ones keep their place among the pending;
        ``first_sends`` numbers the others (moved frames: their PubAck had come)."""
        if first_sends:
            self._pending.update(first_sends)
            self._pending = collections.OrderedDict(sorted(self._pending.items(), key=lambda item: item[1]))
        self._done.clear()
        self.resent += len(tokens)
        self._last_reply = time.monotonic()
        await self._send(b"".join(self._inflight[t][1] for t in tokens))  # progress is a PubAck, not a resend

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

"""Ordered recovery: a subject's messages kept in the task's order through a leader change.

Sent again after later frames of their subject were stored, frames would land behind them. With
``ordered`` (the sink's ``order=subject`` in a cluster, one target stream, ids on), any such trouble
(a 503, a PubAck that overtakes an older frame, silence, a reconnect) stops new sends and runs a
recovery instead: every frame in flight answered or quiet (:data:`QUIET`), the frames whose PubAck
was lost looked for in the stream, the messages of a subject stored ahead of one of its unanswered
frames deleted, and all of them sent again in the task's order (:mod:`.reorder` decides which,
:mod:`.moves` moves them). While order is not in doubt a PubAck of the oldest frame is settled by
:mod:`.acks`' fast loop and nothing is remembered.

:class:`OrderedRecovery` is one part of :class:`~pyspark_jetstream.sink.publish.publisher.Publisher`
(it holds the send numbers, the stored frames that may still move, and the recovery task).
"""

from __future__ import annotations

import asyncio
import collections
import time

from ...protocol.puback import may_be_plain
from .acks import ACK_SEQ, DEAD_LETTER_TAG, status_of
from .moves import is_conditional

QUIET = 0.5
"""Seconds without any reply after which an ordered recovery takes the frames still unanswered as lost."""


class OrderedRecovery:
    """The ordered publisher's bookkeeping and its repair rounds (module docstring)."""

    def _init_recovery(self, ordered_stream: str | None, api_prefix: str, bucket: bool, move_base: int,
                       after_retry: bool = False, replayed: bool = False) -> None:
        # Ordered recovery (module docstring): every frame to one stream, ids to resend safely, a cluster; or
        # a retried attempt without replay records, on any server (see _stored_behind).
        self._ordered = ordered_stream is not None and self._idempotent and (self._retry_503 or after_retry)
        # after_retry: subject -> (the highest sequence its frames were stored at, that frame's position, its
        # first send): every PubAck checked against it (_stored_behind). Only in a retried attempt, whose
        # predecessor may have left a subject's later rows stored and an earlier one missing.
        self._tops: dict[str, tuple[int, int, int]] | None = {} if self._ordered and after_retry else None
        self._stream, self._api_prefix, self._bucket = ordered_stream, api_prefix, bucket
        self._send_no = 0
        # ordered: token -> the number of the frame's first send, oldest first. A resend keeps it: what may be
        # forgotten (_forget_settled) and where a lost PubAck's frame is looked for (_find_stored) depend on
        # when the frame was first sent, not on when it was last resent. OrderedDicts: every PubAck asks for
        # the oldest entry, which a plain dict finds only by skipping the slots of the entries deleted before
        # it (up to a window's worth per PubAck); an OrderedDict's linked list gives it at once.
        self._pending: collections.OrderedDict[str, int] = collections.OrderedDict()
        # ordered: token -> (send no, position, subject, seq, sent)
        self._stored_recent: collections.OrderedDict[str, tuple] = collections.OrderedDict()
        self._max_seq = 0  # ordered: the highest stream sequence a PubAck gave
        self._floors: collections.deque[tuple[int, int]] = collections.deque()  # (first send no, _max_seq then)
        self.found_after_loss = 0  # frames whose PubAck was lost that the stream held (not sent again)
        self._may_send = asyncio.Event()
        self._may_send.set()
        self._recovery: asyncio.Task | None = None
        self._last_reply = time.monotonic()
        self._rounds = 0
        self._move_base = move_base  # see Moves
        self._again = False
        self.reordered = 0  # messages deleted and published again in their subject's order
        self._replaced: dict[str, list[int]] = {}  # token -> old copies to delete once its moved copy is stored
        self._deny_delete: bool | None = None  # the target's deny_delete, asked before the first move
        # A retry: the remembered tokens whose sequence a duplicate PubAck gave (moves._check_duplicates), and
        # whether every such duplicate is in doubt (``replayed``: the replay records found no copy of the row).
        self._dup_tokens: set[str] = set()
        self._verify_dups = replayed and self._tops is not None
        self.moves_finished = 0  # old copies deleted whose moved copy an earlier attempt had stored
        self.restored = 0  # rows whose copy a cut-short move had deleted, published again
        self.left_out_of_order = 0  # ... that the stream would not let the sink delete

    def _on_ordered_ack(self, token: str, data: bytes, headers: bytes | None) -> None:
        """An ordered publisher's reply: stored acks are remembered with their sequence (a recovery may
        move them); one that overtakes an older frame, and any 503, start a recovery.

        When nothing goes wrong the PubAck is the oldest frame's in flight, no recovery runs and nothing
        is remembered: the frame is stored in its place, and :meth:`_forget_settled` would drop its entry
        as soon as it was made. Then only the highest sequence is kept (for :meth:`_find_stored`'s floor);
        the entry is made only once order is in doubt (a frame overtaken, a recovery under way, or frames
        remembered already), so the repair sees every entry it saw before."""
        if not data and status_of(headers) == 503 and token in self._inflight and self._retry_503:
            self._trouble()  # still unanswered, in its place: the recovery sends it again
            return
        pending = self._pending
        send_no = pending.pop(token, None)
        sent = self._inflight.get(token)
        calm = self._calm()
        if sent is not None and send_no is not None and data and not token.startswith(DEAD_LETTER_TAG):
            overtook = bool(pending) and next(iter(pending.values())) < send_no  # an older frame was dropped
            found = ACK_SEQ.search(data)
            if found is not None and b'"error"' not in data:  # stored, or a duplicate: its seq is the original's
                seq = int(found.group(1))
                duplicate = False
                if self._tops is not None:
                    if self._stored_behind(token, send_no, sent, seq):
                        overtook = True  # a recovery moves it (and its subject's later frames) behind the top
                    duplicate = b'"duplicate"' in data
                    if duplicate and self._verify_dups:
                        overtook = True  # a copy the replay records did not find: checked (moves._check_duplicates)
                if overtook or self._stored_recent or not calm:
                    self._remember_stored(token, send_no, sent, seq)
                    if duplicate:
                        self._dup_tokens.add(token)
                elif seq > self._max_seq:
                    self._max_seq = seq  # all _remember_stored keeps of a frame it would forget at once
            if overtook:
                self._trouble()
                calm = False
            if may_be_plain(data):  # the common case, settled here as the unordered fast path does
                del self._inflight[token]
                self.stored += 1
                self._last_progress = time.monotonic()
                left = len(self._inflight)
                if left <= self.low_water:
                    self._room.set()
                if left == 0:
                    self._done.set()
                if calm:
                    self._forget_settled()
                return
        self._on_ack(token, data, headers)
        if calm and self._calm():
            self._forget_settled()

    def _stored_behind(self, token: str, send_no: int, sent: tuple, seq: int) -> bool:
        """A retried attempt without replay records (a batch write without ``writeId``): whether this frame is
        stored at a sequence below one where an earlier frame of its subject (in the task's order) is
        stored. Its predecessor stored the subject's later rows and not an earlier one; this attempt's
        copy of the earlier one was stored new (after them), and their copies come back as duplicates
        with their old sequences (a duplicate's PubAck names the original's). Then the highest frame is
        remembered as the subject's mark, this one with it, and the recovery (:func:`.reorder.ahead`)
        moves this frame and the subject's later ones behind it (issue #39)."""
        subject = sent[2]
        top = self._tops.get(subject)
        if top is None or seq > top[0]:
            self._tops[subject] = (seq, sent[0], send_no)
            return False
        if seq == top[0]:
            return False  # the same copy (a resend answered twice)
        mark = f"top:{top[1]}"  # one per frame marked: a later mark must not hide an earlier inversion
        if mark not in self._stored_recent:
            self._stored_recent[mark] = (top[2], top[1], subject, top[0], None)  # never moved (moves._move)
        return True

    def _calm(self) -> bool:
        """No ordered recovery is under way."""
        return self._recovery is None or self._recovery.done()

    def _in_order(self) -> bool:
        """Nothing puts the order in doubt: no recovery under way, no stored frame remembered (one is
        remembered only while it was sent after a frame still unanswered), and no predecessor's copies to
        check every PubAck against (``_tops``: a retried attempt)."""
        return not self._stored_recent and self._tops is None and (self._recovery is None or self._recovery.done())

    def _remember_stored(self, token: str, send_no: int, sent: tuple, seq: int) -> None:
        """A frame the stream holds at ``seq``: kept (newest last) until no recovery can need to move it."""
        if seq > self._max_seq:
            self._max_seq = seq
        self._stored_recent.pop(token, None)
        self._stored_recent[token] = (send_no, sent[0], sent[2], seq, sent)

    def _forget_settled(self) -> None:
        """Stored frames sent before every unanswered one can never need moving, nor their send's floor
        (``_find_stored``) be needed: forget them (memory stays bounded by the frames in flight).

        Only between recoveries: then every frame stored is in its subject's order (the last recovery
        ended calm, and a PubAck that overtakes an older frame starts a new one). Within a recovery, frames
        stored ahead of an earlier one of their subject may not have been checked yet (:func:`.reorder.ahead`
        runs once nothing is unanswered): forgetting them there, behind a resend still unanswered, lost
        their order silently (issue #39)."""
        oldest = next(iter(self._pending.values()), None)
        floors = self._floors
        if oldest is None:
            floors.clear()
        else:
            while len(floors) > 1 and floors[1][0] <= oldest:
                floors.popleft()
        recent = self._stored_recent
        while recent:
            token, entry = next(iter(recent.items()))
            if oldest is not None and entry[0] >= oldest:
                break
            del recent[token]
            self._dup_tokens.discard(token)

    def _trouble(self) -> None:
        self._may_send.clear()
        if self._recovery is None or self._recovery.done():
            self._again = False
            self._recovery = self._track(self._recover_until_calm())
        else:
            self._again = True  # seen while a round runs: another round follows it

    async def _recover_until_calm(self) -> None:
        while True:
            await self._recover()
            if not self._again:
                self._may_send.set()
                return
            self._again = False

    async def _recover(self) -> None:
        """Module docstring: wait until every frame in flight is answered or quiet; delete the old copies of the
        frames moved whose new copy is stored; send the unanswered ones again, in the task's order; once they
        are answered, move the frames stored ahead of an earlier one of their subject (sent again under a new id,
        their old copies deleted once the new ones are stored); until all is calm."""
        from . import reorder

        while True:
            await self._quiet()
            await self._delete_replaced()
            for token in [t for t in self._pending if t not in self._inflight]:
                del self._pending[token]  # settled another way (a refusal the server sent as -ERR)
            unanswered = sorted((t for t in self._pending if t in self._inflight), key=lambda t: self._inflight[t][0])
            if unanswered:
                unanswered = await self._find_stored(unanswered)
            stored = [reorder.Stored(t, e[1], e[2], e[3]) for t, e in self._stored_recent.items()]
            if unanswered:
                self._rounds += 1
                # A compare-and-set frame goes out only in its subject's order (reorder.in_place): the copies
                # stored ahead of it are deleted before it is sent (moves._move, delete_first).
                now, first = reorder.in_place((reorder.Unanswered(t, self._inflight[t][0], self._inflight[t][2],
                                                                  is_conditional(self._inflight[t]))
                                               for t in unanswered), stored)
                again, first_sends = await self._move(first, delete_first=True)
                now = sorted(now + again, key=lambda t: self._inflight[t][0])
                await self._send_again(now, first_sends)
                continue  # their answers, then the order check
            moved = reorder.ahead(stored)
            if self._tops is not None and self._dup_tokens:
                if await self._check_duplicates({s.token for s in moved}):
                    continue  # rows whose copy was gone went out again: their answers, then the order check
                moved = reorder.ahead(reorder.Stored(t, e[1], e[2], e[3]) for t, e in self._stored_recent.items())
            if not moved:
                return
            self._rounds += 1
            again, first_sends = await self._move(moved)
            if not again:
                return
            await self._send_again(again, first_sends)

    async def _find_stored(self, tokens: list[str]) -> list[str]:
        """Which of the unanswered frames ``tokens`` the stream holds after all (stored, and the PubAck lost
        with the leader): settled as if their PubAck had come, with the sequence the stream gave them.
        Sending them again is not enough: a leader election can outlast the stream's duplicate window (a
        short one, or a slow election), and then the server stores the frame a second time (the chaos
        soak's cluster phase: 418 rows stored twice). Returns the frames still to send. One headers-only
        read of the stream after the highest sequence acked before the oldest of them was sent."""
        from ..records.replay_guard import stored_sequences

        oldest = min(self._pending[t] for t in tokens)  # their first sends: a resend keeps the number
        floor = max((seq for first, seq in self._floors if first <= oldest), default=0)
        wanted = {self._inflight[t][4]: t for t in tokens if self._inflight[t][4]}
        if not wanted:
            return tokens
        found = await stored_sequences(self._nc, self._stream, self._api_prefix, floor, set(wanted),
                                       deadline=self._ack_timeout)
        for msg_id, seq in found.items():
            token = wanted[msg_id]
            self._remember_stored(token, self._pending.pop(token), self._inflight.pop(token), seq)
            self.stored += 1
            self.found_after_loss += 1
        if found:
            self._last_progress = time.monotonic()
            if not self._inflight:
                self._done.set()
            if len(self._inflight) <= self.low_water:
                self._room.set()
        return [t for t in tokens if t in self._inflight]

    async def _quiet(self) -> None:
        """Until every frame in flight is answered, or no answer came for :data:`QUIET` seconds."""
        started = time.monotonic()
        while self._pending and time.monotonic() - self._last_reply < QUIET:
            if time.monotonic() - started > self._ack_timeout:
                return
            await asyncio.sleep(QUIET / 5)

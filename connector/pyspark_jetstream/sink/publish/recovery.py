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
(``pub.recovery``): it owns the recovery task and its rounds, and an :class:`OrderBook` (``book``): the
send numbers (``pending``), the stored frames that may still move (``stored_recent``), the floors of the
stream reads, a retried attempt's marks (``tops``) and doubtful duplicates. It works on the publisher's window (the frames in flight, its events,
sends) and the counts of :class:`~.acks.AckTracker` (``pub.acks``); :class:`~.moves.Mover` (``pub.mover``)
renames frames and deletes their old copies.
"""

from __future__ import annotations

import asyncio
import collections

from ...protocol.puback import id_in_process, may_be_plain
from .acks import ACK_SEQ, DEAD_LETTER_TAG, status_of
from .moves import is_conditional
from .window import clock

QUIET = 0.5
"""Seconds without any reply after which an ordered recovery takes the frames still unanswered as lost."""


class OrderBook:
    """What an ordered publisher remembers of its sends and their PubAcks: the recovery's own (it holds one,
    ``recovery.book``); the PubAck loop of :mod:`.acks` reads ``pending`` and settles the oldest frame there."""

    def __init__(self, after_retry: bool) -> None:
        self.send_no = 0
        # token -> the number of the frame's first send, oldest first. A resend keeps it: what may be forgotten
        # (forget_settled) and where a lost PubAck's frame is looked for (OrderedRecovery._find_stored) depend on
        # when the frame was first sent, not on when it was last resent. OrderedDicts: every PubAck asks for
        # the oldest entry, which a plain dict finds only by skipping the slots of the entries deleted before
        # it (up to a window's worth per PubAck); an OrderedDict's linked list gives it at once.
        self.pending: collections.OrderedDict[str, int] = collections.OrderedDict()
        # token -> (send no, position, subject, seq, sent): stored frames a recovery may still move
        self.stored_recent: collections.OrderedDict[str, tuple] = collections.OrderedDict()
        self.max_seq = 0  # the highest stream sequence a PubAck gave
        self.floors: collections.deque[tuple[int, int]] = collections.deque()  # (first send no, max_seq then)
        # after_retry: subject -> (the highest sequence its frames were stored at, that frame's position, its
        # first send): every PubAck checked against it (stored_behind). Only in a retried attempt, whose
        # predecessor may have left a subject's later rows stored and an earlier one missing.
        self.tops: dict[str, tuple[int, int, int]] | None = {} if after_retry else None
        # A retry: the remembered tokens whose sequence a duplicate PubAck gave (OrderedRecovery._check_duplicates).
        self.dup_tokens: set[str] = set()

    def note_sends(self, chunk: list[tuple], inflight: dict) -> None:
        """``chunk`` goes out now (none a dead letter): numbered, and put in flight. Every frame of it is stored
        after the highest sequence acked so far: where a recovery looks for the ones whose PubAck was lost
        (OrderedRecovery._find_stored)."""
        first = self.send_no + 1
        self.floors.append((first, self.max_seq))
        self.send_no += len(chunk)
        pending = self.pending
        for send_no, sent in enumerate(chunk, first):
            token = str(sent[0])  # no tag: not a dead letter
            inflight[token] = sent
            pending[token] = send_no

    def stored_behind(self, token: str, send_no: int, sent: tuple, seq: int) -> bool:
        """A retried attempt without replay records (a batch write without ``writeId``): whether this frame is
        stored at a sequence below one where an earlier frame of its subject (in the task's order) is
        stored. Its predecessor stored the subject's later rows and not an earlier one; this attempt's
        copy of the earlier one was stored new (after them), and their copies come back as duplicates
        with their old sequences (a duplicate's PubAck names the original's). Then the highest frame is
        remembered as the subject's mark, this one with it, and the recovery (:func:`.reorder.ahead`)
        moves this frame and the subject's later ones behind it (issue #39)."""
        subject = sent[2]
        top = self.tops.get(subject)
        if top is None or seq > top[0]:
            self.tops[subject] = (seq, sent[0], send_no)
            return False
        if seq == top[0]:
            return False  # the same copy (a resend answered twice)
        mark = f"top:{top[1]}"  # one per frame marked: a later mark must not hide an earlier inversion
        if mark not in self.stored_recent:
            self.stored_recent[mark] = (top[2], top[1], subject, top[0], None)  # never moved (Mover.move)
        return True

    def remember(self, token: str, send_no: int, sent: tuple, seq: int) -> None:
        """A frame the stream holds at ``seq``: kept (newest last) until no recovery can need to move it."""
        if seq > self.max_seq:
            self.max_seq = seq
        self.stored_recent.pop(token, None)
        self.stored_recent[token] = (send_no, sent[0], sent[2], seq, sent)

    def forget_settled(self) -> None:
        """Stored frames sent before every unanswered one can never need moving, nor their send's floor
        (``OrderedRecovery._find_stored``) be needed: forget them (memory stays bounded by the frames in flight).

        Only between recoveries: then every frame stored is in its subject's order (the last recovery
        ended calm, and a PubAck that overtakes an older frame starts a new one). Within a recovery, frames
        stored ahead of an earlier one of their subject may not have been checked yet (:func:`.reorder.ahead`
        runs once nothing is unanswered): forgetting them there, behind a resend still unanswered, lost
        their order silently (issue #39)."""
        oldest = next(iter(self.pending.values()), None)
        floors = self.floors
        if oldest is None:
            floors.clear()
        else:
            while len(floors) > 1 and floors[1][0] <= oldest:
                floors.popleft()
        recent = self.stored_recent
        while recent:
            token, entry = next(iter(recent.items()))
            if oldest is not None and entry[0] >= oldest:
                break
            del recent[token]
            self.dup_tokens.discard(token)

class OrderedRecovery:
    """The ordered publisher's repair rounds, and what it remembers for them (``book``) (module docstring)."""

    def __init__(self, pub, nc, ordered_stream: str | None, api_prefix: str, ordered: bool,
                 after_retry: bool = False) -> None:
        self._pub = pub
        self._nc = nc  # the stream reads (replay_guard)
        self.ordered = ordered  # publisher.__init__ says when
        self.book = OrderBook(ordered and after_retry)
        self._stream, self._api_prefix = ordered_stream, api_prefix
        self.found_after_loss = 0  # frames whose PubAck was lost that the stream held (not sent again)
        self.may_send = asyncio.Event()  # cleared while a recovery runs: nothing new goes out
        self.may_send.set()
        self._task: asyncio.Task | None = None
        self.last_reply = clock()
        self._rounds = 0  # numbers the moved copies of each round (Mover.renamed)
        self._again = False
        self.restored = 0  # rows whose copy a cut-short move had deleted, published again

    def on_ordered_ack(self, token: str, data: bytes, headers: bytes | None) -> None:
        """An ordered publisher's reply: stored acks are remembered with their sequence (a recovery may
        move them); one that overtakes an older frame, and any 503, start a recovery.

        When nothing goes wrong the PubAck is the oldest frame's in flight, no recovery runs and nothing
        is remembered: the frame is stored in its place, and :meth:`OrderBook.forget_settled` would drop its
        entry as soon as it was made. Then only the highest sequence is kept (for :meth:`_find_stored`'s floor);
        the entry is made only once order is in doubt (a frame overtaken, a recovery under way, or frames
        remembered already), so the repair sees every entry it saw before."""
        pub = self._pub
        inflight = pub.window.inflight
        if token in inflight and ((not data and status_of(headers) == 503 and pub.window.retry_503)
                                  or (data and id_in_process(data))):
            # Still unanswered, in its place (for 10158 an earlier copy with its id is still proposed): the
            # recovery finds it stored, or sends it again in its subject's order.
            self.trouble()
            return
        book = self.book
        pending = book.pending
        send_no = pending.pop(token, None)
        sent = inflight.get(token)
        calm = self.calm()
        if sent is not None and send_no is not None and data and not token.startswith(DEAD_LETTER_TAG):
            overtook = bool(pending) and next(iter(pending.values())) < send_no  # an older frame was dropped
            found = ACK_SEQ.search(data)
            if found is not None and b'"error"' not in data:  # stored, or a duplicate: its seq is the original's
                seq = int(found.group(1))
                duplicate = False
                if book.tops is not None:
                    if book.stored_behind(token, send_no, sent, seq):
                        overtook = True  # a recovery moves it (and its subject's later frames) behind the top
                    duplicate = b'"duplicate"' in data
                    if duplicate:
                        overtook = True  # a copy an earlier attempt stored, perhaps moved since: checked (_check_duplicates)
                if overtook or book.stored_recent or not calm:
                    book.remember(token, send_no, sent, seq)
                    if duplicate:
                        book.dup_tokens.add(token)
                elif seq > book.max_seq:
                    book.max_seq = seq  # all OrderBook.remember keeps of a frame it would forget at once
            if overtook:
                self.trouble()
                calm = False
            if may_be_plain(data):  # the common case, settled here as the unordered fast path does
                del inflight[token]
                pub.acks.stored += 1
                pub.window.eased()
                if calm:
                    book.forget_settled()
                return
        pub.acks.on_ack(token, data, headers)
        if calm and self.calm():
            book.forget_settled()

    def calm(self) -> bool:
        """No ordered recovery is under way."""
        return self._task is None or self._task.done()

    def in_order(self) -> bool:
        """Nothing puts the order in doubt: no recovery under way, no stored frame remembered (one is
        remembered only while it was sent after a frame still unanswered), and no predecessor's copies to
        check every PubAck against (``book.tops``: a retried attempt)."""
        return not self.book.stored_recent and self.book.tops is None and (self._task is None or self._task.done())

    def trouble(self) -> None:
        """Order is in doubt: stop new sends and run a recovery (another round, if one runs)."""
        self.may_send.clear()
        if self._task is None or self._task.done():
            self._again = False
            self._task = self._pub.track(self._recover_until_calm())
        else:
            self._again = True  # seen while a round runs: another round follows it

    async def _recover_until_calm(self) -> None:
        while True:
            await self._recover()
            if not self._again:
                self.may_send.set()
                return
            self._again = False

    async def _recover(self) -> None:
        """Module docstring: wait until every frame in flight is answered or quiet; delete the old copies of the
        frames moved whose new copy is stored; send the unanswered ones again, in the task's order; once they
        are answered, move the frames stored ahead of an earlier one of their subject (sent again under a new id,
        their old copies deleted once the new ones are stored); until all is calm."""
        from . import reorder

        pub = self._pub
        inflight = pub.window.inflight
        while True:
            await self._quiet()
            await pub.mover.delete_replaced(inflight, {f.position for f in pub.acks.failures if not f.dead_letter})
            for token in [t for t in self.book.pending if t not in inflight]:
                del self.book.pending[token]  # settled another way (a refusal the server sent as -ERR)
            unanswered = sorted((t for t in self.book.pending if t in inflight), key=lambda t: inflight[t][0])
            if unanswered:
                unanswered = await self._find_stored(unanswered)
            stored = [reorder.Stored(t, e[1], e[2], e[3]) for t, e in self.book.stored_recent.items()]
            if unanswered:
                self._rounds += 1
                # A compare-and-set frame goes out only in its subject's order (reorder.in_place): the copies
                # stored ahead of it are deleted before it is sent (Mover.move, delete_first).
                now, first = reorder.in_place((reorder.Unanswered(t, inflight[t][0], inflight[t][2],
                                                                  is_conditional(inflight[t]))
                                               for t in unanswered), stored)
                again, first_sends = await self._move(first, delete_first=True)
                now = sorted(now + again, key=lambda t: inflight[t][0])
                await self._send_again(now, first_sends)
                continue  # their answers, then the order check
            moved = reorder.ahead(stored)
            if self.book.tops is not None and self.book.dup_tokens:
                if await self._check_duplicates():
                    continue  # rows whose copy was gone went out again: their answers, then the order check
                moved = reorder.ahead(reorder.Stored(t, e[1], e[2], e[3]) for t, e in self.book.stored_recent.items())
            if not moved:
                return
            self._rounds += 1
            again, first_sends = await self._move(moved)
            if not again:
                return
            await self._send_again(again, first_sends)

    async def _move(self, frames: list, delete_first: bool = False) -> tuple[list[str], dict[str, int]]:
        """The stored frames ``frames`` (:class:`.reorder.Stored`) forgotten here and handed to the mover
        (:meth:`.moves.Mover.move`); the ones it renamed are put in flight, no longer counted as stored: (their
        tokens, their first send numbers)."""
        pub = self._pub
        taken = []
        for frame in frames:
            taken.append((frame.token, frame.seq, self.book.stored_recent.pop(frame.token)))
            self.book.dup_tokens.discard(frame.token)
        again, first_sends = [], {}
        for token, sent, first_send in await pub.mover.move(taken, pub.reply_prefix, self._rounds, delete_first):
            pub.window.inflight[token] = sent
            again.append(token)
            first_sends[token] = first_send
        pub.acks.stored -= len(again)
        return again, first_sends

    async def _check_duplicates(self) -> bool:
        """A retried attempt (``book.tops``): the remembered frames whose sequence a duplicate PubAck gave (a copy an
        earlier attempt stored), checked in the target (:meth:`.moves.Mover.finish_moves`): the earlier attempt
        may have moved the row since (its moved copy stored, the old one not yet deleted when it died), whether
        or not the old copy looks out of order; every duplicate, as the fault schedules showed (issue #54:
        a row stored twice when only the ones to move were checked). One that a moved copy stands for is taken as
        stored there; one whose copy is gone is sent again under a moved id, and its duplicate does not count.
        Whether rows went out again (their answers come before the order check)."""
        suspects = [t for t in self.book.dup_tokens if t in self.book.stored_recent]
        if not suspects:
            return False
        pub = self._pub
        self.book.dup_tokens.difference_update(suspects)
        standing, lost = await pub.mover.finish_moves({t: self.book.stored_recent[t] for t in suspects})
        for token, seq in standing.items():
            entry = self.book.stored_recent[token]
            self.book.stored_recent[token] = (*entry[:3], seq, entry[4])
        if not lost:
            return False
        self._rounds += 1
        lost.sort(key=lambda t: self.book.stored_recent[t][1])
        first_sends = {}
        for token in lost:
            entry = self.book.stored_recent.pop(token)
            pub.window.inflight[token] = pub.mover.renamed(entry[4], pub.reply_prefix, self._rounds)
            first_sends[token] = entry[0]
        pub.acks.duplicates -= len(lost)  # the server's "duplicate" named a copy that is gone: not stored
        self.restored += len(lost)
        await self._send_again(lost, first_sends)
        return True

    async def _send_again(self, tokens: list[str], first_sends: dict[str, int] | None = None) -> None:
        """Send ``tokens`` again, in this order. Unanswered ones keep their place among the pending;
        ``first_sends`` numbers the others (moved frames: their PubAck had come)."""
        pub = self._pub
        if first_sends:
            self.book.pending.update(first_sends)
            self.book.pending = collections.OrderedDict(sorted(self.book.pending.items(), key=lambda item: item[1]))
        pub.window.done.clear()
        pub.resent += len(tokens)
        self.last_reply = clock()
        await pub.send(b"".join(pub.window.inflight[t][1] for t in tokens))  # progress is a PubAck, not a resend

    async def _find_stored(self, tokens: list[str]) -> list[str]:
        """Which of the unanswered frames ``tokens`` the stream holds after all (stored, and the PubAck lost
        with the leader): settled as if their PubAck had come, with the sequence the stream gave them.
        Sending them again is not enough: a leader election can outlast the stream's duplicate window (a
        short one, or a slow election), and then the server stores the frame a second time (the chaos
        soak's cluster phase: 418 rows stored twice). Returns the frames still to send. One headers-only
        read of the stream after the highest sequence acked before the oldest of them was sent."""
        from ..records.replay_guard import stored_sequences

        pub = self._pub
        inflight = pub.window.inflight
        oldest = min(self.book.pending[t] for t in tokens)  # their first sends: a resend keeps the number
        floor = max((seq for first, seq in self.book.floors if first <= oldest), default=0)
        wanted = {inflight[t][4]: t for t in tokens if inflight[t][4]}
        if not wanted:
            return tokens
        found = await stored_sequences(self._nc, self._stream, self._api_prefix, floor, set(wanted),
                                       deadline=pub.window.ack_timeout)
        for msg_id, seq in found.items():
            token = wanted[msg_id]
            self.book.remember(token, self.book.pending.pop(token), inflight.pop(token), seq)
            pub.acks.stored += 1
            self.found_after_loss += 1
        if found:
            pub.window.eased()
        return [t for t in tokens if t in inflight]

    async def _quiet(self) -> None:
        """Until every frame in flight is answered, or no answer came for :data:`QUIET` seconds."""
        started = clock()
        while self.book.pending and clock() - self.last_reply < QUIET:
            if clock() - started > self._pub.window.ack_timeout:
                return
            await asyncio.sleep(QUIET / 5)

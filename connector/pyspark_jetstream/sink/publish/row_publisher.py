"""What a write task uses of its publisher: one declared interface, two implementations (issue #54).

:class:`~.publisher.Publisher` awaits a PubAck per row; :class:`~.batched.BatchedPublisher` sends the rows
in fast-ingest batches. The task (sink/task/write.py) picks one from the plan and uses only what this
interface declares, so neither is told apart by ``getattr``.

The words, one meaning each (docs/architecture.md, glossary): **stored** counts rows the target holds
because of this publisher and that were new there; **duplicates** counts rows the server dropped because
it held their ``Nats-Msg-Id`` already (both rows *acknowledged*); a **failure** is a row the server refused,
kept for the task to settle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..encode.frames import ReplyForm


class RowPublisher(ABC):
    """A task's publisher (module docstring). ``reply_prefix``: where the per-row PubAcks and dead letters'
    answers come (``<inbox>.``); ``low_water``: the rows the task encodes at once (half of ``maxPendingAcks``)."""

    reply_prefix: str
    low_water: int

    @property
    @abstractmethod
    def reply_form(self) -> ReplyForm:
        """The reply subject the task's encoder makes its frames with."""

    @abstractmethod
    async def publish(self, frames: list[tuple], *, dead_letter: bool = False) -> None:
        """Send ``frames`` (OutFrame layout), returning once the window has room for more."""

    @abstractmethod
    async def drain(self) -> None:
        """Until every frame sent has its answer."""

    @abstractmethod
    async def abort(self) -> None:
        """Close after the task failed: nothing sent so far goes out afterwards."""

    @abstractmethod
    async def close(self) -> None:
        """Close after the task ended well."""

    @property
    @abstractmethod
    def failures(self) -> list:
        """The refusals not settled yet (:class:`~.acks.AckFailure`); the task takes them by setting []."""

    @failures.setter
    @abstractmethod
    def failures(self, value: list) -> None: ...

    @property
    @abstractmethod
    def stored(self) -> int: ...

    @property
    @abstractmethod
    def duplicates(self) -> int: ...

    @property
    @abstractmethod
    def dead_lettered(self) -> int: ...

    @property
    @abstractmethod
    def reordered(self) -> int:
        """Messages moved back into their subject's order."""

    @property
    @abstractmethod
    def left_out_of_order(self) -> int:
        """Messages left ahead of an earlier one of their subject (deletes denied, a moved copy refused)."""

    @property
    @abstractmethod
    def moves_finished(self) -> int: ...

    @property
    @abstractmethod
    def restored(self) -> int: ...

    @property
    @abstractmethod
    def batches(self) -> int:
        """Fast-ingest batches the rows went in (0: a PubAck per row)."""

    @abstractmethod
    def moved_copy(self, sent: tuple) -> tuple:
        """``sent`` under this attempt's moved id (a retry putting a row back behind a missing one)."""

    @abstractmethod
    async def delete_stored(self, seqs: list[int]) -> int:
        """Delete the target's messages at ``seqs``; how many it would not delete."""

"""The user's own headers (the ``headers`` column): checked, and the ones that steer the server set aside.

A ``Nats-TTL`` or ``Nats-Msg-Id`` among them takes its place in the TTL and message-id precedence
(:mod:`.checks`); every other header must be a valid name and value. From rows as read (the source's
``stream`` and ``seq`` columns) the headers the server or the original publisher owns are left out
(``Nats-*``, the sequence header of option ``sequenceBy``, a KV operation): :mod:`.encoder`'s
docstring says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import headers as hdrs
from ...protocol.ttl import InvalidTtl
from .rows import RowRejection, shown

if TYPE_CHECKING:
    from .layout import EncoderConfig, InputLayout
    from .rows import Columns, EncodedBatch


class UserHeaders:
    """The ``headers`` column of one task's rows, checked row by row (module docstring)."""

    def __init__(self, layout: InputLayout, config: EncoderConfig) -> None:
        self.layout = layout
        self.config = config

    def check(self, rows: Columns, live: list[int], first: int, generated: list[str | None],
              out: EncodedBatch) -> tuple[dict[int, list[tuple[str, str]]], dict[int, Any], dict[int, Any], list[int]]:
        """Each row's user headers, checked; a ``Nats-TTL`` or ``Nats-Msg-Id`` among them set aside."""
        headers_col = rows.headers
        pairs: dict[int, list[tuple[str, str]]] = {}
        header_ttls: dict[int, Any] = {}
        header_ids: dict[int, Any] = {}
        if self.layout.headers is None:
            return pairs, header_ttls, header_ids, live
        kept = []
        for i in live:
            row_headers = headers_col[i]
            if row_headers:
                row_pairs: list[tuple[str, str]] = []
                try:
                    ttl, msg_id = self._parse(row_headers, row_pairs)
                except (hdrs.InvalidHeader, InvalidTtl) as exc:
                    out.rejected.append(RowRejection(first + i, rows.subjects[i], str(exc), "headers",
                                                     shown(row_headers), payload=rows.payload(i),
                                                     msg_id=generated[i]))
                    continue
                if row_pairs:
                    pairs[i] = row_pairs
                if ttl is not None:
                    header_ttls[i] = ttl
                if msg_id is not None:
                    header_ids[i] = msg_id
            kept.append(i)
        return pairs, header_ttls, header_ids, kept

    def _parse(self, row_headers: list[tuple[str, Any]], pairs: list[tuple[str, str]]) -> tuple[Any, Any]:
        ttl = msg_id = None
        allow_rollup = self.config.allow_rollup
        as_read = self.layout.as_read
        for name, value in row_headers:
            lowered = name.lower() if isinstance(name, str) else None
            values = value if self.layout.headers_multi else [value]
            if values is None:
                continue
            if as_read and lowered is not None and lowered.startswith(hdrs.RESERVED_PREFIX) and not (
                    allow_rollup and lowered == hdrs.ROLLUP.lower()):
                continue  # owned by the server or the original publisher (module docstring)
            if lowered == _SEQUENCE:
                if as_read:
                    continue  # the source's order, not the target's (module docstring)
                raise hdrs.InvalidHeader(f"header {name!r} is set by the option 'sequenceBy' (a KV value's order); "
                                         "a row cannot set it")
            if self.config.bucket is not None and lowered == _KV_OPERATION:
                if as_read:
                    continue  # the 'operation' column carries it
                raise hdrs.InvalidHeader(f"header {name!r} is set by the 'operation' column (PUT, DEL or PURGE)")
            if lowered == "nats-ttl":
                if ttl is not None:
                    raise hdrs.InvalidHeader("the headers carry Nats-TTL twice (in different cases)")
                ttl = _single(name, values)
                continue
            if lowered == "nats-msg-id":
                if msg_id is not None:
                    raise hdrs.InvalidHeader("the headers carry Nats-Msg-Id twice (in different cases)")
                msg_id = hdrs.check_header_value(name, _single(name, values))
                continue
            hdrs.check_header_name(name, allow_rollup=allow_rollup)
            for v in values:
                if v is None:
                    continue
                pairs.append((name, hdrs.check_header_value(name, v)))
        return ttl, msg_id


_KV_OPERATION = hdrs.KV_OPERATION.lower()


_SEQUENCE = hdrs.SEQUENCE.lower()


def _single(name: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if len(present) > 1:
        raise hdrs.InvalidHeader(f"header {name!r} has {len(present)} values; it takes one")
    return present[0] if present else None

"""Whether a partition still reads the stream it was planned against, checked when its task runs.

A plan may wait: a streaming micro-batch replayed after a restart, a batch DataFrame run again. By
then the stream may have been deleted (the read fails, naming the option to check) or deleted and
created again under the same name (its sequences restarted and mean other messages now): with
``failOnDataLoss`` the read fails, without it the partition's range of the old stream is skipped
with a warning. The stream's identity is its creation time, carried by the partition.
"""

from __future__ import annotations

from typing import Any

from ...errors import StreamConfigError, StreamRecreatedError
from ...logs import get_logger
from ...options import SourceOptions

log = get_logger("source")


def still_the_planned_stream(opts: SourceOptions, stream: str, info: dict[str, Any] | None, created: str | None,
                             first: int, last: int | None) -> bool:
    """Whether the partition of ``first..last`` goes on reading ``stream`` (its ``STREAM.INFO``: ``info``,
    None when it is gone), planned against the stream created at ``created`` (None: not checked). False:
    the stream was recreated and the range is skipped (``failOnDataLoss=false``); raises otherwise."""
    where = f"sequences {first}..{last}" if last is not None else f"sequences from {first} on"
    if info is None:
        raise StreamConfigError(f"Stream '{stream}' was deleted after this read was planned ({where} were to be "
                                "read). Check the option 'stream'.")
    if created is not None and info.get("created") != created:
        error = StreamRecreatedError(stream, first - 1, created, int(info["state"]["last_seq"]), info.get("created"))
        if opts.fail_on_data_loss:
            raise error
        log.warning("%s %s of the old stream are skipped (failOnDataLoss=false).", error, where.capitalize())
        return False
    return True

"""How a write publishes (option ``publish.mode``): in fast-ingest batches, or with a PubAck per row.

Decided once per query on the driver, from the target's config as the start-up check left it, and
carried to the tasks in the plan (:class:`PublishMode`). ``batched`` where nothing below stands in
the way; ``auto`` falls back to ``acked`` and logs why once; ``batched`` fails at start naming what
is missing. What keeps a write from batches (:func:`blocker`):

- no target stream or bucket named (a write by subject alone): the sink cannot check the stream;
- a server older than 2.14.3 (fast-ingest commits after a gap are right from 2.14.3 on);
- a mirror (it takes no publishes, and no batches), a stream without ``allow_batched``;
- ``sequenceBy``: each key's row is published under compare-and-set and the races with other
  writers are expected; every refusal would end a batch (a round trip each), and the reduction
  drains after every flush anyway, so batches buy nothing there.

The reasons and the other paths (a replay that moves rows, dead letters, rows outside the target
stream) are in docs/architecture.md, "Fast-ingest writes".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...client.fast_publisher import MIN_SERVER
from ...client.jsapi import server_version
from ...client.nats_internals import is_clustered
from ...errors import OptionError
from ...logs import get_logger
from ...protocol import kv

log = get_logger("sink")


@dataclass(frozen=True)
class PublishMode:
    """``batched``: the tasks publish in fast-ingest batches to ``target``, whose subjects are
    ``subjects`` (a row outside them takes the acked path, where the server refuses it as it would
    any); else ``reason`` says why not."""

    batched: bool = False
    target: str | None = None
    subjects: tuple[str, ...] = ()
    reason: str = ""


def version_text(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def blocker(version: tuple[int, int, int], target: str | None, config: dict[str, Any] | None,
            sequence_by: str | None) -> str | None:
    """What keeps a write from fast-ingest batches, or None (pure: the module docstring's list)."""
    if target is None:
        return "no target stream is named (options 'stream' or 'bucket'), so the sink cannot check it takes batches"
    if version < MIN_SERVER:
        return (f"nats-server {version_text(version)} has no fast-ingest batches (2.14.3 or later; "
                "stream setting allow_batched)")
    if config is None:
        return f"stream '{target}' was not found"
    if config.get("mirror"):
        return f"stream '{target}' is a mirror of '{(config['mirror'] or {}).get('name')}', which cannot take batches"
    if config.get("allow_batched") is not True:
        return (f"stream '{target}' does not allow fast-ingest batches (its setting allow_batched is false; "
                "a stream the sink creates with ensureStream='create' has it on a single server, and in a cluster with "
                "publish.mode='batched')")
    if sequence_by is not None:
        return ("option 'sequenceBy' publishes each key under compare-and-set, where every refusal would end a "
                "batch")
    return None


def decide(nc: Any, opts: Any, config: dict[str, Any] | None) -> PublishMode:
    """The write's :class:`PublishMode` (``config``: the target's config, None when there is none);
    ``auto`` logs a fallback once, ``batched`` refuses one with :class:`OptionError`."""
    target = kv.stream_name(opts.bucket) if opts.bucket is not None else opts.stream
    if opts.publish_mode == "acked":
        return PublishMode(reason="option 'publish.mode' is 'acked'")
    reason = blocker(server_version(nc) or (0, 0, 0), target, config, opts.sequence_by)
    if reason is None:
        subjects = tuple((config or {}).get("subjects") or ())
        return PublishMode(batched=True, target=target, subjects=subjects)
    if opts.publish_mode == "batched":
        where = f"stream '{target}'" if target is not None else "this write"
        raise OptionError("publish.mode", "batched", f"{where} cannot take fast-ingest batches: {reason}. Set "
                          "'publish.mode' to 'auto' or 'acked' to publish with a PubAck per row.")
    log.info("JetStream sink: publishing to %s with a PubAck per row (option 'publish.mode' is 'auto'): %s",
             target or "the rows' subjects", reason)
    return PublishMode(reason=reason)


def allow_batches(nc: Any, opts: Any, config: dict[str, Any]) -> str | None:
    """``ensureStream=create`` / ``ensureBucket=create``: set ``allow_batched`` in the new ``config`` when
    the server has fast-ingest batches and the write may use them; the change to log, or None.

    In a cluster only when asked (``publish.mode=batched``): a stream with ``allow_batched`` requires API level
    4 (``_nats.req.level``), and the sink sees the version of the server it is connected to only. Measured on
    two 2.15.1 nodes and one 2.12.8 (a rolling upgrade): with a 2.15.1 meta leader the R3 stream was created
    and its 2.12.8 replica never became current (one replica short until that node is upgraded, turning
    ``allow_batched`` off again did not bring it back); with the 2.12.8 meta leader the create failed (10025,
    unknown field). docs/architecture.md, "allow_batched on streams the sink creates"."""
    if opts.publish_mode == "acked" or config.get("mirror") or (server_version(nc) or (0, 0, 0)) < MIN_SERVER:
        return None
    if opts.publish_mode == "auto" and is_clustered(nc):
        return None
    config["allow_batched"] = True
    return "AllowBatched enabled (fast-ingest batches)"

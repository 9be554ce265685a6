"""What the sink's ``ensureStream`` may create or change in a stream: ADR-43's rules, as a pure plan.

The decisions are pure functions of the stream's current config and the sink's
options (:func:`plan_stream`), so every ADR-43 restriction is unit-tested
without a server; :mod:`pyspark_jetstream.sink.stream_admin` only does the I/O
around them. ADR-43 restrictions enforced here, before the server would refuse
or silently change something:

* AllowMsgTTL can be enabled on an existing stream, never disabled;
* SubjectDeleteMarkerTTL is at least 1s and never set on a mirror;
* with SubjectDeleteMarkerTTL, AllowRollup is true and DenyPurge false (and
  nats-server cannot turn DenyPurge off by an update);
* a counter stream (AllowMsgCounter) cannot take TTLs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import StreamConfigError

if TYPE_CHECKING:  # the sink's parsed options, read here, never imported at run time
    from ..options import SinkOptions

_NS = 1_000_000_000


@dataclass(frozen=True)
class StreamPlan:
    """What :func:`ensure_stream` must do: nothing, create ``config`` or update to ``config``."""

    action: str  # "none" | "create" | "update"
    config: dict[str, Any] | None = None
    changes: tuple[str, ...] = ()


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    pat = pattern.split(".")
    sub = subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def _sdm_ns(opts: SinkOptions) -> int | None:
    sdm = opts.stream_settings.subject_delete_marker_ttl
    return None if sdm is None else int(round(sdm * _NS))


def new_stream_config(opts: SinkOptions, needs_ttl: bool) -> dict[str, Any]:
    s = opts.stream_settings
    subjects = list(s.subjects) if s.subjects else [opts.subject]
    config: dict[str, Any] = {
        "name": opts.stream,
        "subjects": subjects,
        "retention": "limits",
        "storage": s.storage,
        "num_replicas": s.replicas,
        "max_age": int(round(s.max_age * _NS)),
        "max_msgs_per_subject": s.max_msgs_per_subject,
        "duplicate_window": int(round(s.duplicate_window * _NS)),
        "discard": "old",
        # The sink exists to publish TTL'd rows; enabling it costs nothing otherwise
        # and cannot be undone by accident (ADR-43).
        "allow_msg_ttl": True,
    }
    sdm = _sdm_ns(opts)
    if sdm is not None:
        config.update(subject_delete_marker_ttl=sdm, allow_rollup_hdrs=True, deny_purge=False)
    return config


def plan_stream(current: dict[str, Any] | None, opts: SinkOptions, needs_ttl: bool) -> StreamPlan:
    """Decide, without I/O, how ``ensureStream`` brings the stream in line, or refuse.

    ``current`` is the ``config`` of STREAM.INFO, or ``None`` when the stream is missing.
    """
    name = opts.stream
    mode = opts.ensure_stream
    if current is None:
        if mode == "validate":
            raise StreamConfigError(
                f"Stream '{name}' does not exist. Create it (e.g. `nats stream add {name} --allow-msg-ttl`) "
                "or set the option ensureStream to 'create'."
            )
        return StreamPlan("create", new_stream_config(opts, needs_ttl), ("created",))

    is_mirror = bool(current.get("mirror"))
    if is_mirror:
        raise StreamConfigError(
            f"Stream '{name}' is a mirror of '{current['mirror'].get('name')}': it does not accept publishes. "
            "Write to the origin stream instead."
        )
    if needs_ttl and current.get("allow_msg_counter"):
        raise StreamConfigError(
            f"Stream '{name}' is a counter stream (AllowMsgCounter), which cannot use per-message TTLs. "
            "Write rows without 'ttl' / 'defaultTtl', or use another stream."
        )
    if opts.subject is not None and not any(subject_matches(p, opts.subject) for p in current.get("subjects") or []):
        raise StreamConfigError(
            f"Stream '{name}' does not capture subject '{opts.subject}' (its subjects: "
            f"{', '.join(current.get('subjects') or []) or 'none'}). Fix the option 'subject' or the stream's subjects."
        )

    changes: list[str] = []
    config = dict(current)
    if needs_ttl and not current.get("allow_msg_ttl"):
        if mode != "update":
            raise StreamConfigError(
                f"Stream '{name}' does not allow per-message TTLs (AllowMsgTTL is false), but rows can carry "
                "a TTL (a 'ttl' column, 'defaultTtl' or 'preserveExpiry'). Enable it with ensureStream='update' "
                f"or `nats stream edit {name} --allow-msg-ttl` (ADR-43: it cannot be disabled afterwards)."
            )
        config["allow_msg_ttl"] = True
        changes.append("AllowMsgTTL enabled")
    sdm = _sdm_ns(opts)
    if sdm is not None and current.get("subject_delete_marker_ttl", 0) != sdm:
        if mode != "update":
            raise StreamConfigError(
                f"Stream '{name}' has SubjectDeleteMarkerTTL {current.get('subject_delete_marker_ttl', 0) / _NS:g}s, "
                f"not the requested {sdm / _NS:g}s (option 'stream.subjectDeleteMarkerTtl'). Set ensureStream='update' "
                "to change it, or drop the option."
            )
        if current.get("deny_purge"):
            # nats-server refuses to turn DenyPurge off by an update (err_code 10052).
            raise StreamConfigError(
                f"Stream '{name}' has DenyPurge=true, which an update cannot turn off, and SubjectDeleteMarkerTTL "
                "needs DenyPurge=false (ADR-43). Recreate the stream without DenyPurge, or drop the option "
                "'stream.subjectDeleteMarkerTtl'."
            )
        config["subject_delete_marker_ttl"] = sdm
        # ADR-43: markers need roll-ups and the purge permission; markers imply TTLs.
        config["allow_rollup_hdrs"] = True
        config["deny_purge"] = False
        config["allow_msg_ttl"] = True
        changes.append(f"SubjectDeleteMarkerTTL set to {sdm / _NS:g}s (AllowRollup on, DenyPurge off)")
    check_ttl_transition(current, config)
    if not changes:
        return StreamPlan("none")
    return StreamPlan("update", config, tuple(changes))


def check_ttl_transition(current: dict[str, Any], desired: dict[str, Any]) -> None:
    """ADR-43: AllowMsgTTL can be enabled, never disabled; SDM needs its companions."""
    if current.get("allow_msg_ttl") and not desired.get("allow_msg_ttl"):
        raise StreamConfigError(
            f"Stream '{desired.get('name')}': AllowMsgTTL cannot be disabled once enabled (ADR-43)."
        )
    sdm = desired.get("subject_delete_marker_ttl") or 0
    if sdm:
        if sdm < _NS:
            raise StreamConfigError(
                f"Stream '{desired.get('name')}': SubjectDeleteMarkerTTL must be at least 1s (ADR-43)."
            )
        if desired.get("mirror"):
            raise StreamConfigError(
                f"Stream '{desired.get('name')}': SubjectDeleteMarkerTTL cannot be set on a mirror (ADR-43)."
            )
        if not desired.get("allow_rollup_hdrs") or desired.get("deny_purge"):
            raise StreamConfigError(
                f"Stream '{desired.get('name')}': SubjectDeleteMarkerTTL requires AllowRollup=true and "
                "DenyPurge=false (ADR-43)."
            )

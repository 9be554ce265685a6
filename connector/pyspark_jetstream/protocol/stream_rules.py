"""What the sink's ``ensureStream`` may create or change in a stream: ADR-43's rules, as a pure plan.

The decisions are pure functions of the stream's current config and what the sink
asks (:class:`StreamRequest`, plain values; :func:`plan_stream`), so every ADR-43 restriction is unit-tested
without a server; :mod:`pyspark_jetstream.sink.plan.stream_admin` only does the I/O
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
from typing import Any

from .subjects import subject_matches

_NS = 1_000_000_000


class StreamRuleError(ValueError):
    """A stream or bucket the rules refuse; the message says why and what to do.

    Pure code raises it; the sink (:mod:`pyspark_jetstream.sink.plan.stream_admin`) hands it to the
    user as :class:`pyspark_jetstream.errors.StreamConfigError`, so ``protocol/`` needs nothing
    from the connector's error tree."""


@dataclass(frozen=True)
class StreamSettings:
    """A stream the sink creates or updates, as the ``stream.*`` options give it (seconds for durations)."""

    subjects: tuple[str, ...] | None = None
    storage: str = "file"
    replicas: int = 1
    max_age: float = 0.0
    max_msgs_per_subject: int = -1
    duplicate_window: float = 120.0
    subject_delete_marker_ttl: float | None = None


@dataclass(frozen=True)
class StreamRequest:
    """What the sink asks of its target stream: ``name``, the ``subject`` it publishes to (None when
    each row names its own), ``mode`` (``ensureStream``: validate, create or update) and the settings
    of a stream it may create or update."""

    name: str
    subject: str | None = None
    mode: str = "validate"
    settings: StreamSettings = StreamSettings()


@dataclass(frozen=True)
class StreamPlan:
    """What :func:`plan_stream` (or :func:`pyspark_jetstream.protocol.kv.plan_bucket`) decided:
    nothing, create ``config`` or update to ``config``."""

    action: str  # "none" | "create" | "update"
    config: dict[str, Any] | None = None
    changes: tuple[str, ...] = ()


def plan_missing(mode: str, refusal: str, config: dict[str, Any]) -> StreamPlan:
    """A missing stream or bucket: create it with ``config`` when ``mode`` allows, else refuse saying ``refusal``."""
    if mode == "validate":
        raise StreamRuleError(refusal)
    return StreamPlan("create", config, ("created",))


def refuse_mirror(current: dict[str, Any], what: str, instead: str) -> None:
    """A mirror takes no publishes: refuse ``what`` before a row is sent."""
    if current.get("mirror"):
        raise StreamRuleError(f"{what} is a mirror of '{current['mirror'].get('name')}': it does not accept "
                              f"{instead}")


def _sdm_ns(settings: StreamSettings) -> int | None:
    sdm = settings.subject_delete_marker_ttl
    return None if sdm is None else int(round(sdm * _NS))


def new_stream_config(request: StreamRequest) -> dict[str, Any]:
    """The stream ``ensureStream='create'`` creates: the settings' subjects (else the sink's one subject),
    limits retention, AllowMsgTTL on."""
    s = request.settings
    subjects = list(s.subjects) if s.subjects else [request.subject]
    config: dict[str, Any] = {
        "name": request.name,
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
    sdm = _sdm_ns(s)
    if sdm is not None:
        config.update(subject_delete_marker_ttl=sdm, allow_rollup_hdrs=True, deny_purge=False)
    return config


def plan_stream(current: dict[str, Any] | None, request: StreamRequest, needs_ttl: bool) -> StreamPlan:
    """Decide, without I/O, how ``ensureStream`` brings the stream in line, or refuse (:class:`StreamRuleError`).

    ``current`` is the ``config`` of STREAM.INFO, or ``None`` when the stream is missing;
    ``needs_ttl``: rows can carry a TTL.
    """
    name = request.name
    mode = request.mode
    if current is None:
        return plan_missing(mode, f"Stream '{name}' does not exist. Create it (e.g. `nats stream add {name} "
                                  "--allow-msg-ttl`) or set the option ensureStream to 'create'.",
                            new_stream_config(request))
    refuse_mirror(current, f"Stream '{name}'", "publishes. Write to the origin stream instead.")
    if needs_ttl and current.get("allow_msg_counter"):
        raise StreamRuleError(
            f"Stream '{name}' is a counter stream (AllowMsgCounter), which cannot use per-message TTLs. "
            "Write rows without 'ttl' / 'defaultTtl', or use another stream."
        )
    subject = request.subject
    if subject is not None and not any(subject_matches(p, subject) for p in current.get("subjects") or []):
        raise StreamRuleError(
            f"Stream '{name}' does not capture subject '{subject}' (its subjects: "
            f"{', '.join(current.get('subjects') or []) or 'none'}). Fix the option 'subject' or the stream's subjects."
        )

    changes: list[str] = []
    config = dict(current)
    if needs_ttl and not current.get("allow_msg_ttl"):
        if mode != "update":
            raise StreamRuleError(
                f"Stream '{name}' does not allow per-message TTLs (AllowMsgTTL is false), but rows can carry "
                "a TTL (a 'ttl' column, 'defaultTtl' or 'preserveExpiry'). Enable it with ensureStream='update' "
                f"or `nats stream edit {name} --allow-msg-ttl` (ADR-43: it cannot be disabled afterwards)."
            )
        config["allow_msg_ttl"] = True
        changes.append("AllowMsgTTL enabled")
    sdm = _sdm_ns(request.settings)
    if sdm is not None and current.get("subject_delete_marker_ttl", 0) != sdm:
        if mode != "update":
            raise StreamRuleError(
                f"Stream '{name}' has SubjectDeleteMarkerTTL {current.get('subject_delete_marker_ttl', 0) / _NS:g}s, "
                f"not the requested {sdm / _NS:g}s (option 'stream.subjectDeleteMarkerTtl'). Set ensureStream='update' "
                "to change it, or drop the option."
            )
        if current.get("deny_purge"):
            # nats-server refuses to turn DenyPurge off by an update (err_code 10052).
            raise StreamRuleError(
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
        raise StreamRuleError(
            f"Stream '{desired.get('name')}': AllowMsgTTL cannot be disabled once enabled (ADR-43)."
        )
    sdm = desired.get("subject_delete_marker_ttl") or 0
    if sdm:
        if sdm < _NS:
            raise StreamRuleError(
                f"Stream '{desired.get('name')}': SubjectDeleteMarkerTTL must be at least 1s (ADR-43)."
            )
        if desired.get("mirror"):
            raise StreamRuleError(
                f"Stream '{desired.get('name')}': SubjectDeleteMarkerTTL cannot be set on a mirror (ADR-43)."
            )
        if not desired.get("allow_rollup_hdrs") or desired.get("deny_purge"):
            raise StreamRuleError(
                f"Stream '{desired.get('name')}': SubjectDeleteMarkerTTL requires AllowRollup=true and "
                "DenyPurge=false (ADR-43)."
            )

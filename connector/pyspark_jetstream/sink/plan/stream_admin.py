"""The sink's stream check and setup (option ``ensureStream``): the I/O around
:func:`pyspark_jetstream.protocol.stream_rules.plan_stream`, and the checks that the
subjects the sink writes to are captured by a stream."""

from __future__ import annotations

from ...client import jsapi
from ...errors import JetStreamApiError, StreamConfigError
from ...logs import get_logger
from ...options import SinkOptions
from ...protocol import kv
from ...protocol.stream_rules import StreamPlan, StreamRuleError, plan_stream
from .publish_mode import allow_batches

log = get_logger("stream_admin")


async def _carry_out(nc, plan: StreamPlan, what: str, options: str, prefix: str) -> None:
    """Create or update the stream as ``plan`` says, naming ``what`` and its ``options`` on a refusal."""
    try:
        if plan.action == "create":
            await jsapi.create_stream(nc, plan.config, prefix)
        elif plan.action == "update":
            await jsapi.update_stream(nc, plan.config, prefix)
    except JetStreamApiError as exc:
        others = ""
        if exc.err_code == jsapi.ERR_STREAM_SUBJECT_OVERLAP:
            others = await _overlapping(nc, plan.config, prefix)
        raise StreamConfigError(
            f"Could not {plan.action} {what}: {exc.description} (err_code {exc.err_code}){others}. "
            f"Check the {options} options."
        ) from None
    if plan.action != "none":
        log.info("%s: %s", what[0].upper() + what[1:], "; ".join(plan.changes))


async def _overlapping(nc, config: dict, prefix: str) -> str:
    """Which streams already capture the subjects of ``config`` (the server's overlap error names none)."""
    found: dict[str, list[str]] = {}
    try:
        for subject in config.get("subjects") or []:
            for name, subjects in await jsapi.streams_capturing(nc, subject, prefix):
                if name != config.get("name"):
                    found[name] = subjects
    except JetStreamApiError:
        return ""  # the refusal is still reported, only without the names
    if not found:
        return ""
    return ": " + "; ".join(f"stream '{name}' captures {', '.join(repr(s) for s in subjects)}"
                            for name, subjects in found.items()) + (
        ". Write to that stream (option 'stream'), or give this one subjects no other stream captures")


def _with_batches(nc, opts: SinkOptions, plan: StreamPlan) -> StreamPlan:
    """A stream or bucket the sink creates takes fast-ingest batches where the server has them
    (option 'publish.mode', sink/plan/publish_mode.py)."""
    if plan.action != "create" or plan.config is None:
        return plan
    config = dict(plan.config)
    change = allow_batches(nc, opts, config)
    return plan if change is None else StreamPlan(plan.action, config, (*plan.changes, change))


async def ensure_stream(nc, opts: SinkOptions, needs_ttl: bool) -> dict:
    """Check (and per ``ensureStream`` create or update) the target stream; return its config as it now is."""
    info = await jsapi.stream_info(nc, opts.stream, opts.api_prefix)
    try:
        plan = plan_stream(info["config"] if info else None, opts.stream_request, needs_ttl)
    except StreamRuleError as exc:
        raise StreamConfigError(str(exc)) from None
    plan = _with_batches(nc, opts, plan)
    await _carry_out(nc, plan, f"stream '{opts.stream}'", "'stream.*'", opts.api_prefix)
    return plan.config if plan.config is not None else info["config"]


async def ensure_bucket(nc, opts: SinkOptions, needs_ttl: bool, *, may_purge: bool) -> StreamPlan:
    """Check (and per ``ensureBucket`` create or update) the target KV bucket's stream; warn when its
    duplicate window is short (exactly-once holds only for a replay inside it)."""
    info = await jsapi.stream_info(nc, kv.stream_name(opts.bucket), opts.api_prefix)
    try:
        plan = kv.plan_bucket(info["config"] if info else None, opts.bucket, opts.bucket_settings,
                              opts.ensure_bucket, needs_ttl=needs_ttl, may_purge=may_purge)
    except StreamRuleError as exc:
        raise StreamConfigError(str(exc)) from None
    plan = _with_batches(nc, opts, plan)
    await _carry_out(nc, plan, f"KV bucket '{opts.bucket}'", "'bucket.*'", opts.api_prefix)
    window = kv.short_duplicate_window(plan.config if plan.config else info["config"])
    if window is not None and opts.idempotent:
        log.warning("KV bucket %s de-duplicates message ids for %gs only (its duplicate window): a replay of a "
                    "micro-batch later than that after its first attempt writes its rows again.", opts.bucket, window)
    return plan


async def check_dead_letter_subject(nc, subject: str, prefix: str = jsapi.API_PREFIX) -> str:
    """The dead-letter subject must be stored somewhere, or diverted rows would be lost."""
    names = await jsapi.stream_names_for_subject(nc, subject, prefix)
    if not names:
        raise StreamConfigError(
            f"No stream captures the dead-letter subject '{subject}' (option 'deadLetterSubject'), so rejected rows "
            f"would be lost. Create one, e.g. `nats stream add DLQ --subjects '{subject}'`."
        )
    return names[0]


async def check_capturing_stream(nc, subject: str, prefix: str = jsapi.API_PREFIX) -> None:
    """Without option 'stream', TTL rows still need a stream that allows TTLs."""
    names = await jsapi.stream_names_for_subject(nc, subject, prefix)
    if not names:
        raise StreamConfigError(
            f"No stream captures subject '{subject}' (option 'subject'). Create one, or name it in option 'stream' "
            "with ensureStream='create'."
        )
    info = await jsapi.stream_info(nc, names[0], prefix)
    if info and not info["config"].get("allow_msg_ttl"):
        raise StreamConfigError(
            f"Stream '{names[0]}' (which captures '{subject}') does not allow per-message TTLs (AllowMsgTTL is "
            f"false), but rows can carry a TTL. Enable it with `nats stream edit {names[0]} --allow-msg-ttl`, or "
            "set options stream and ensureStream='update'."
        )

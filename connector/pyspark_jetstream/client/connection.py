"""Opening NATS connections: the one place where a secret is unwrapped.

Connection errors are turned into :class:`NatsConnectError` with messages that
name the servers and the authentication *method*, never a password or token.
nats-py's own error callback would log exceptions (which can echo connect
options) at ERROR level, so it is replaced by one that logs only the type.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from ..errors import NatsConnectError
from ..logs import get_logger
from ..options import ConnectionOptions

log = get_logger("connection")

CLIENT_NAME = "pyspark-jetstream"


def auth_method(opts: ConnectionOptions) -> str:
    if opts.user is not None:
        return "user/password"
    if opts.token is not None:
        return "token"
    if opts.creds_file is not None:
        return "credentials file"
    if opts.nkey_seed_file is not None:
        return "NKey seed"
    return "no authentication"


def _tls_context(opts: ConnectionOptions) -> ssl.SSLContext | None:
    wants_tls = opts.tls_ca_file or opts.tls_cert_file or any(s.startswith("tls://") for s in opts.servers)
    if not wants_tls:
        return None
    ctx = ssl.create_default_context(cafile=opts.tls_ca_file)
    if opts.tls_cert_file and opts.tls_key_file:
        ctx.load_cert_chain(opts.tls_cert_file, opts.tls_key_file)
    return ctx


INITIAL_CONNECT_ATTEMPTS = 2
"""Each server is tried this many extra times before the first connect gives up.
nats-py would loop forever with unlimited reconnects, so the limit is lifted
only once the connection is up."""


def connect_kwargs(opts: ConnectionOptions, errors_seen: list[BaseException] | None = None,
                   events: Any = None) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect``; contains secrets, so never log it."""

    async def quiet_error_cb(exc: Exception) -> None:
        if errors_seen is not None:
            errors_seen.append(exc)
        if events is not None:
            events.on_error(exc)
        log.debug("NATS connection event: %s", type(exc).__name__)

    kwargs: dict[str, Any] = {
        "servers": list(opts.servers),
        "name": CLIENT_NAME,
        "connect_timeout": opts.connect_timeout,
        "allow_reconnect": True,
        "max_reconnect_attempts": INITIAL_CONNECT_ATTEMPTS,
        "reconnect_time_wait": 0.5,
        "error_cb": quiet_error_cb,
        "pending_size": 8 * 1024 * 1024,
    }
    if opts.user is not None and opts.password is not None:
        kwargs["user"] = opts.user
        kwargs["password"] = opts.password.reveal()
    if opts.token is not None:
        kwargs["token"] = opts.token.reveal()
    if opts.creds_file is not None:
        kwargs["user_credentials"] = opts.creds_file
    if opts.nkey_seed_file is not None:
        kwargs["nkeys_seed"] = opts.nkey_seed_file
    tls = _tls_context(opts)
    if tls is not None:
        kwargs["tls"] = tls
    return kwargs


async def open_connection(opts: ConnectionOptions):
    """Connect, retrying only inside nats-py's connect timeout; a clear error otherwise."""
    import nats
    import nats.errors

    from .nats_internals import ConnectionEvents, adopt

    seen: list[BaseException] = []
    events = ConnectionEvents()
    # nats-py can stall in a failing TLS upgrade; bound the whole first connect.
    budget = opts.connect_timeout * (INITIAL_CONNECT_ATTEMPTS + 1) + 2.0
    try:
        nc = await asyncio.wait_for(nats.connect(**connect_kwargs(opts, seen, events), **events.callbacks()), budget)
    except Exception as exc:  # nats-py raises a zoo of types here; translate them all
        def is_auth(error: BaseException) -> bool:
            lowered = str(error).lower()
            return isinstance(error, nats.errors.AuthorizationError) or "authorization" in lowered \
                or "authentication" in lowered

        if seen and isinstance(exc, (nats.errors.NoServersError, asyncio.TimeoutError)):
            # An attempt may end in a reset connection after the server refused the
            # credentials on an earlier one; the refusal is what the user must fix.
            exc = next((e for e in seen if is_auth(e)), seen[-1])
        text = str(exc).lower()
        reason = type(exc).__name__
        if is_auth(exc):
            reason = "the server refused the credentials (authorization violation)"
        elif isinstance(exc, nats.errors.NoServersError) or "no servers" in text:
            reason = "no server answered"
        elif isinstance(exc, ssl.SSLError) or "ssl" in text or "certificate" in text:
            reason = f"TLS handshake failed ({type(exc).__name__}: {getattr(exc, 'reason', None) or exc})"
        elif isinstance(exc, TimeoutError):
            reason = f"timed out after connectTimeout={opts.connect_timeout:g}s"
        raise NatsConnectError(
            f"Cannot connect to NATS at {', '.join(opts.servers)} using {auth_method(opts)}: {reason}. "
            "Check the option 'servers' and the authentication options."
        ) from None
    adopt(nc, events)  # from now on, ride through restarts
    return nc

"""The connection options, shared by reads and writes: servers, authentication, TLS, and where
JetStream's API is (``domain`` / ``apiPrefix``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError
from .spec import (
    OptionSpec,
    Secret,
    as_fields,
    parse_duration_seconds,
    parse_existing_file,
    parse_name,
    parse_secret,
    parse_servers,
    parse_subject,
    parse_text,
)

_FILE = "Expected the path of a readable file that exists on the driver and on every executor."

CONNECTION_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("servers", "nats://127.0.0.1:4222", "Expected comma-separated NATS URLs such as 'nats://host:4222,tls://host2:4222', "
               "without credentials (use 'user'/'password', 'token', 'credsFile' or 'nkeySeedFile').",
               "NATS server URLs, comma-separated.", parse_servers),
    OptionSpec("user", None, "Expected a non-empty user name.", "User name (with `password`).", parse_text),
    OptionSpec("password", None, "Expected a non-empty password.", "Password (with `user`). Redacted everywhere.", parse_secret, secret=True),
    OptionSpec("token", None, "Expected a non-empty token.", "Authentication token. Redacted everywhere.", parse_secret, secret=True),
    OptionSpec("credsFile", None, _FILE, "Path of a `.creds` file (JWT and NKey seed, operator mode).", parse_existing_file),
    OptionSpec("nkeySeedFile", None, _FILE, "Path of a file holding an NKey user seed.", parse_existing_file),
    OptionSpec("tlsCaFile", None, _FILE, "CA certificate (PEM) to verify the servers.", parse_existing_file),
    OptionSpec("tlsCertFile", None, _FILE, "Client certificate (PEM) for mutual TLS (with `tlsKeyFile`).", parse_existing_file),
    OptionSpec("tlsKeyFile", None, _FILE, "Client private key (PEM) for mutual TLS (with `tlsCertFile`).", parse_existing_file),
    OptionSpec("connectTimeout", "10s", "Expected a duration of at least 1s, such as '10s'.",
               "How long to wait for a connection to the servers.", parse_duration_seconds(1.0)),
    OptionSpec("domain", None, "Expected a JetStream domain name (letters, digits, '-' and '_').",
               "JetStream domain of the stream, when it is not the connected server's own (a hub seen from a leaf "
               "node, a leaf seen from the hub): every JetStream API request goes to `$JS.<domain>.API`. Exclusive "
               "with `apiPrefix`.", parse_name),
    OptionSpec("apiPrefix", None, "Expected a subject prefix without wildcards or whitespace, such as 'JS.hub.API'.",
               "Prefix under which this account imports another account's JetStream API (instead of `$JS.API`). "
               "Exclusive with `domain`.", lambda raw: parse_subject(raw.strip().rstrip("."))),
)


@dataclass(frozen=True)
class ConnectionOptions:
    """Everything needed to open a connection; hashable so connections can be cached by it."""

    servers: tuple[str, ...]
    user: str | None = None
    password: Secret | None = None
    token: Secret | None = None
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    connect_timeout: float = 10.0




def api_prefix(values: Mapping[str, Any]) -> str:
    """The JetStream API prefix the options ask for: ``$JS.API``, ``$JS.<domain>.API`` or ``apiPrefix``."""
    if values["domain"] is not None and values["apiPrefix"] is not None:
        raise OptionError("apiPrefix", values["apiPrefix"], "Set either 'domain' or 'apiPrefix', not both.")
    if values["domain"] is not None:
        return f"$JS.{values['domain']}.API"
    return values["apiPrefix"] or "$JS.API"


def connection_from(values: Mapping[str, Any]) -> ConnectionOptions:
    if (values["user"] is None) != (values["password"] is None):
        missing = "password" if values["password"] is None else "user"
        raise OptionError(missing, None, "Options 'user' and 'password' must be set together.")
    methods = [
        name
        for name, present in (
            ("user/password", values["user"] is not None),
            ("token", values["token"] is not None),
            ("credsFile", values["credsFile"] is not None),
            ("nkeySeedFile", values["nkeySeedFile"] is not None),
        )
        if present
    ]
    if len(methods) > 1:
        raise OptionError(methods[1], "<set>", f"Choose one authentication method; got {' and '.join(methods)}.")
    if (values["tlsCertFile"] is None) != (values["tlsKeyFile"] is None):
        missing = "tlsKeyFile" if values["tlsKeyFile"] is None else "tlsCertFile"
        raise OptionError(missing, None, "Options 'tlsCertFile' and 'tlsKeyFile' must be set together.")
    return ConnectionOptions(**as_fields(values, "servers", "user", "password", "token", "credsFile", "nkeySeedFile",
                                         "tlsCaFile", "tlsCertFile", "tlsKeyFile", "connectTimeout"))


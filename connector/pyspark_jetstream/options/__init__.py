"""The options a user gives ``format("jetstream")``, one module per role.

* :mod:`.spec`: the machinery (one option's spec, value parsers, the table parser, secrets, Kafka hints);
* :mod:`.connection`: servers, authentication, TLS and the JetStream API prefix, for both directions;
* :mod:`.source`: reads of a stream or a bucket; :mod:`.sink`: writes to a stream; :mod:`.kv`: writes to a bucket;
  :mod:`.lookup`: a DataFrame joined with a bucket's values.

Each table (``CONNECTION_OPTIONS``, ``SOURCE_OPTIONS``, ``SINK_OPTIONS``, ``KV_SINK_OPTIONS``) is the
reference for its options: the tables in ``docs/`` are generated from them and a test keeps them in
step. The two entry points below tell each direction which names belong to the other one, so an
option given to the wrong direction is named as such rather than as a typo.
"""

from __future__ import annotations

from collections.abc import Mapping

from .connection import CONNECTION_OPTIONS, ConnectionOptions
from .kv import KV_SINK_OPTIONS
from .lookup import LOOKUP_OPTIONS, LookupOptions, parse_lookup_options
from .sink import SINK_OPTIONS, SinkOptions, check_write_has_options
from .sink import parse_sink_options as _parse_sink
from .source import SOURCE_OPTIONS, SourceOptions, StartingPosition
from .source import parse_source_options as _parse_source
from .spec import OptionSpec, Secret

__all__ = [
    "CONNECTION_OPTIONS", "KV_SINK_OPTIONS", "LOOKUP_OPTIONS", "LookupOptions", "SINK_OPTIONS", "SOURCE_OPTIONS", "ConnectionOptions", "OptionSpec",
    "Secret", "SinkOptions", "SourceOptions", "StartingPosition", "check_write_has_options", "parse_sink_options",
    "parse_lookup_options", "parse_source_options",
]


def parse_source_options(raw: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """A read's options (see :func:`.source.parse_source_options`)."""
    writes_only = SINK_OPTIONS + tuple(s for s in KV_SINK_OPTIONS if s.name != "bucket")
    return _parse_source(raw, streaming=streaming, elsewhere=writes_only)


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    """A write's options (see :func:`.sink.parse_sink_options`)."""
    return _parse_sink(raw, elsewhere=SOURCE_OPTIONS)

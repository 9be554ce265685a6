"""The embedded nats-server, where the examples and the README import it from.

It lives in :mod:`pyspark_jetstream.tools.server` (a tool, never imported by the data path).
"""

from .tools.server import EmbeddedNatsCluster, EmbeddedNatsServer, find_nats_server_binary

__all__ = ["EmbeddedNatsCluster", "EmbeddedNatsServer", "find_nats_server_binary"]

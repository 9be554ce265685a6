"""What a target stream's settings leave to chance after a PubAck, free of I/O.

Exactly-once rests on the server keeping what it acknowledged. Jepsen's analysis of NATS 2.12.1
(2025-12) found acknowledged writes lost on power failure: the file store acknowledges before it
fsyncs (every 2 minutes by default, server option ``sync_interval``), so only other replicas hold
a write in between, and a stream with one replica has none. A stream whose ``persist_mode`` is
``async`` (2.12+) acknowledges before it even stores. The sink logs these once at start.
"""

from __future__ import annotations

from typing import Any


def durability_risks(info: dict[str, Any]) -> list[str]:
    """The risks of a target stream, from its ``STREAM.INFO`` reply (config and cluster)."""
    config = info.get("config") or {}
    cluster = info.get("cluster") or {}
    risks = []
    if int(config.get("num_replicas") or 1) == 1 and cluster.get("name"):
        risks.append(f"it has one replica on a clustered server (cluster '{cluster['name']}'): a write acknowledged "
                     "but not yet synced to disk (sync_interval, 2 minutes by default) is lost with that server's "
                     "power; use 3 replicas")
    if str(config.get("persist_mode") or "").lower() == "async":
        risks.append("its persist_mode is 'async': the server acknowledges a write before storing it; use the "
                     "default persist mode")
    return risks

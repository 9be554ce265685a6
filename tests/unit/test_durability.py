"""The target settings that can lose acknowledged writes (Jepsen, NATS 2.12.1), as plain values."""

from __future__ import annotations

from pyspark_jetstream.protocol.durability import durability_risks


def test_one_replica_on_a_cluster_and_async_persistence_are_risks():
    clustered = {"name": "C1", "leader": "n1"}
    assert durability_risks({"config": {"num_replicas": 3}, "cluster": clustered}) == []
    assert durability_risks({"config": {"num_replicas": 1}, "cluster": {"leader": "n1"}}) == []  # a single server
    one = durability_risks({"config": {"num_replicas": 1}, "cluster": clustered})
    assert len(one) == 1 and "one replica" in one[0] and "'C1'" in one[0]
    assert durability_risks({"config": {"num_replicas": 3, "persist_mode": "async"}, "cluster": clustered}) == [
        "its persist_mode is 'async': the server acknowledges a write before storing it; use the default persist "
        "mode"]
    assert durability_risks({"config": {"persist_mode": "default"}}) == []

"""The source a user would write in an afternoon: a SimpleDataSourceStreamReader that
calls nats-py's pull_subscribe().fetch() on the driver. Used only by the benchmark, as
the baseline the connector's streaming read must beat by 5x."""

from __future__ import annotations

import asyncio
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader


class NaiveReader(SimpleDataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.servers = options["servers"]
        self.stream = options["stream"]
        self.batch = int(options.get("batch", "10000"))

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def _fetch(self, after: int, limit: int | None) -> tuple[list[tuple[Any, ...]], int]:
        async def go():
            import nats
            from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

            nc = await nats.connect(self.servers)
            js = nc.jetstream()
            config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                    opt_start_seq=after + 1, inactive_threshold=10.0)
            sub = await js.pull_subscribe(">", stream=self.stream, config=config)
            rows, last = [], after
            try:
                msgs = await sub.fetch(self.batch if limit is None else min(self.batch, limit), timeout=5)
            except Exception:
                msgs = []
            for m in msgs:
                seq = m.metadata.sequence.stream
                if limit is not None and seq > after + limit:
                    break
                rows.append((m.subject, m.data, seq))
                last = seq
            await sub.unsubscribe()
            await nc.close()
            return rows, last

        return asyncio.run(go())

    def read(self, start: dict):
        rows, last = self._fetch(start["seq"], None)
        return iter(rows), {"seq": last}

    def readBetweenOffsets(self, start: dict, end: dict):
        rows, _ = self._fetch(start["seq"], end["seq"] - start["seq"])
        return iter(rows)


class NaiveSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "naive_jetstream"

    def schema(self) -> str:
        return "subject string, data binary, seq long"

    def simpleStreamReader(self, schema):
        return NaiveReader(dict(self.options))

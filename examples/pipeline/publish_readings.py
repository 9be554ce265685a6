"""Publish sensor readings for the pipeline example (the stream is created if it is missing).

    python publish_readings.py --count 200               # readings 0..199 to SENSORS
    python publish_readings.py --first 200 --count 100   # then 100 more

Reading ``i`` is ``{"sensor": "s<i mod --sensors>", "reading": i, "temp": ...}`` on
``<stream in lower case>.s<n>``, with a temperature from 60.5 to 99.5 that reaches the
pipeline's alert threshold (90) for a quarter of the readings. The servers are ``--servers``,
else ``NATS_URL``, else ``nats://127.0.0.1:4222``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import nats
from nats.js.errors import NotFoundError


def reading(i: int, sensors: int) -> dict:
    return {"sensor": f"s{i % sensors}", "reading": i, "temp": 60.5 + (i * 7) % 40}


async def publish(servers: str, stream: str, first: int, count: int, sensors: int) -> None:
    nc = await nats.connect(servers.split(","))
    try:
        js = nc.jetstream()
        try:
            await js.stream_info(stream)
        except NotFoundError:
            await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        for i in range(first, first + count):
            body = reading(i, sensors)
            await js.publish(f"{stream.lower()}.{body['sensor']}", json.dumps(body).encode())
    finally:
        await nc.close()
    print(f"Published readings {first}..{first + count - 1} to {stream}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--stream", default="SENSORS")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--sensors", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(publish(args.servers, args.stream, args.first, args.count, args.sensors))


if __name__ == "__main__":
    main()

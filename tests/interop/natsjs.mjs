// The nats.js side of tests/interop/check_nats_js.py: writes what nats.js users write, and reads
// back what the connector wrote, printing JSON on stdout. Run by that script, not by pytest.
//   node natsjs.mjs write <url>            stream JSW and bucket jskv, as nats.js writes them
//   node natsjs.mjs stream <url> <stream>  every message of a stream
//   node natsjs.mjs kv <url> <bucket>      the history of every key of a bucket
import { connect } from "@nats-io/transport-node";
import { headers } from "@nats-io/nats-core";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";

const [mode, url, name] = process.argv.slice(2);
const nc = await connect({ servers: url });
const jsm = await jetstreamManager(nc);
const js = jetstream(nc);
const b64 = (data) => Buffer.from(data).toString("base64");
const hdrs = (h) => {
  const out = {};
  if (!h) return out;
  for (const [k, v] of h) out[k] = v;
  return out;
};

async function history(kv) {
  const out = [];
  for await (const e of await kv.history()) {
    out.push({ key: e.key, revision: e.revision, operation: e.operation, value: b64(e.value) });
    if (e.delta === 0) break;
  }
  return out;
}

if (mode === "write") {
  await jsm.streams.add({ name: "JSW", subjects: ["jsw.>"], allow_msg_ttl: true });
  const acks = [];
  const h1 = headers();
  h1.append("X-Tag", "a");
  h1.append("X-Tag", "b");
  h1.append("X-Space", "  padded  ");
  acks.push(await js.publish("jsw.one", new Uint8Array([0, 1, 2, 255]), { headers: h1, msgID: "js-1", ttl: "1h" }));
  acks.push(await js.publish("jsw.two", "plain text", { expect: { streamName: "JSW" } }));
  acks.push(await js.publish("jsw.three", new Uint8Array(0), { ttl: "never" }));
  const kvm = new Kvm(nc);
  // nats-server 2.15 stores a create's TTL as at least the bucket's marker TTL (2s -> 20), so the
  // key lives 20 s and its MaxAge marker 20 s more: the caller reads the bucket within that time.
  const kv = await kvm.create("jskv", { history: 5, markerTTL: 20_000 });
  await kv.create("short", "gone-soon", "2s");
  await kv.put("stay", "here");
  await kv.put("del", "x");
  await kv.delete("del");
  await kv.put("gone", "y");
  await kv.purge("gone");
  const deadline = Date.now() + 60_000;
  while ((await kv.get("short"))?.operation !== "PURGE") {
    if (Date.now() > deadline) throw new Error("the short key's MaxAge marker never came");
    await new Promise((r) => setTimeout(r, 200));
  }
  console.log(JSON.stringify({ acks: acks.map((a) => a.seq), kv: await history(kv) }));
} else if (mode === "stream") {
  const info = await jsm.streams.info(name);
  const out = [];
  for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++) {
    const m = await jsm.streams.getMessage(name, { seq });
    if (m) out.push({ seq: m.seq, subject: m.subject, data: b64(m.data), headers: hdrs(m.header), time: m.timestamp });
  }
  console.log(JSON.stringify(out));
} else if (mode === "kv") {
  const kv = await new Kvm(nc).open(name);
  console.log(JSON.stringify(await history(kv)));
}
await nc.close();

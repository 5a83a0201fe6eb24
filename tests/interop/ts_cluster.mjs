#!/usr/bin/env node
// A long-lived client on the official TypeScript SDK (@modelcontextprotocol/sdk 1.x),
// driven one command per stdin line, for the cluster tests (tests/it/cluster_e2e.rs).
//
// Usage: node tests/interop/ts_cluster.mjs URL
//
// Keeps ONE Client over ONE StreamableHTTPClientTransport for its whole life: every
// command goes through the same session, so a re-initialize would show (the gateways log
// each session they open). Prints {"ready": true, "sessionId": ...} once connected, then
// one JSON line per command (the same commands as tests/interop/py_cluster.py):
//
//   list                    {"tools": [names]}
//   call NAME ARGS_JSON     {"content": [...], "isError": bool}
//   subscribe URI           {"ok": true}
//   level LEVEL             {"ok": true}                (logging/setLevel)
//   elicit                  calc__ask_elicit; the client accepts with {"name": "Ada"}:
//                           {"content": [...], "isError": bool, "asked": N}
//   progress                calc__slow with 3 steps and onprogress:
//                           {"progress": N, "content": [...], "isError": bool}
//   notifications           {"notifications": [{"method", "params"}...]} received so far
//   session                 {"sessionId": ...} (the one the SDK sends now)
//   quit                    DELETE of the session, then close: {"closed": true}
//
// A command that fails prints {"error": "..."} and the client goes on. Transport errors
// (a GET stream cut and reopened) go to stderr.
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const url = process.argv[2];
if (!url || process.argv.length !== 3) {
  console.error("usage: ts_cluster.mjs URL");
  process.exit(2);
}

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const describe = (e) => (e instanceof Error ? `${e.name}: ${e.message}` : String(e));

const transport = new StreamableHTTPClientTransport(new URL(url));
const client = new Client({ name: "ts-cluster-client", version: "1.0.0" }, { capabilities: { elicitation: {} } });
const notes = [];
let asked = 0;
client.fallbackNotificationHandler = async (n) => {
  notes.push({ method: n.method, params: n.params ?? null });
};
client.setRequestHandler(ElicitRequestSchema, async () => {
  asked += 1;
  return { action: "accept", content: { name: "Ada" } };
});
client.onerror = (e) => console.error(`ts_cluster: ${describe(e)}`);
const opts = { timeout: 15000 };
const result = (res) => ({ content: res.content ?? [], isError: Boolean(res.isError) });

try {
  await client.connect(transport, opts);
} catch (e) {
  out({ error: describe(e), fatal: true });
  process.exit(1);
}
out({ ready: true, sessionId: transport.sessionId ?? null });

const rl = createInterface({ input: process.stdin, terminal: false });
for await (const raw of rl) {
  const line = raw.trim();
  if (!line) continue;
  const sp = line.indexOf(" ");
  const cmd = sp < 0 ? line : line.slice(0, sp);
  const rest = sp < 0 ? "" : line.slice(sp + 1);
  try {
    if (cmd === "list") {
      const page = await client.listTools({}, opts);
      out({ tools: page.tools.map((t) => t.name) });
    } else if (cmd === "call") {
      const s = rest.indexOf(" ");
      const name = s < 0 ? rest : rest.slice(0, s);
      const args = s < 0 ? {} : JSON.parse(rest.slice(s + 1));
      out(result(await client.callTool({ name, arguments: args }, undefined, opts)));
    } else if (cmd === "subscribe") {
      await client.subscribeResource({ uri: rest }, opts);
      out({ ok: true });
    } else if (cmd === "level") {
      await client.setLoggingLevel(rest, opts);
      out({ ok: true });
    } else if (cmd === "elicit") {
      const before = asked;
      const res = await client.callTool({ name: "calc__ask_elicit", arguments: { message: "name?" } }, undefined, opts);
      out({ ...result(res), asked: asked - before });
    } else if (cmd === "progress") {
      let seen = 0;
      const res = await client.callTool(
        { name: "calc__slow", arguments: { seconds: 0.6, steps: 3 } },
        undefined,
        { ...opts, onprogress: () => { seen += 1; } },
      );
      out({ ...result(res), progress: seen });
    } else if (cmd === "notifications") {
      out({ notifications: notes });
    } else if (cmd === "session") {
      out({ sessionId: transport.sessionId ?? null });
    } else if (cmd === "quit") {
      break;
    } else {
      out({ error: `unknown command ${JSON.stringify(cmd)}` });
    }
  } catch (e) {
    out({ error: describe(e) });
  }
}
try {
  await transport.terminateSession();
} catch (e) {
  console.error(`ts_cluster: DELETE failed: ${describe(e)}`);
}
await client.close().catch(() => {});
out({ closed: true });
process.exit(0);

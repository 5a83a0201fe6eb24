#!/usr/bin/env node
// Interop client on the official TypeScript SDK (@modelcontextprotocol/sdk 1.x).
//
// Usage:
//   node tests/interop/ts_client.mjs [--tool NAME] [--args JSON] [--timeout SECONDS] --url URL
//   node tests/interop/ts_client.mjs [--tool NAME] [--args JSON] [--timeout SECONDS] --stdio CMD [ARGS...]
//
// --answer JSON declares the client capabilities it names and answers the server's
// questions with them: {"elicit": {content}, "sample": "text", "roots": [{uri, name}]}.
// The methods asked are listed, in order, under "asked" in the output line.
//
// --stdio consumes EVERYTHING after it as the server command line, so put it last.
// The child inherits this process's full environment (the SDK default would pass only a
// small allow-list such as HOME/PATH/USER) and its stderr is forwarded to our stderr.
//
// Lists all tools (following nextCursor), optionally calls --tool with --args, and prints
// ONE JSON line to stdout:
//   {"tools":[...names], "result":[...content]|null, "isError":bool|null,
//    "structuredContent":...|null, "protocolVersion":"...", "serverInfo":{...}|null}
// Exit 0 on success; on failure prints a message to stderr and exits 1 (2 for usage errors).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

function usage(msg) {
  console.error(`ts_client: ${msg}`);
  console.error("usage: ts_client.mjs [--tool NAME] [--args JSON] [--timeout SECONDS] (--url URL | --stdio CMD [ARGS...])");
  process.exit(2);
}

const argv = process.argv.slice(2);
let url = null, stdio = null, tool = null, toolArgs = {}, timeoutS = 30, answers = null;
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const next = () => {
    if (i + 1 >= argv.length) usage(`${a} needs a value`);
    return argv[++i];
  };
  if (a === "--url") url = next();
  else if (a === "--tool") tool = next();
  else if (a === "--args") {
    try { toolArgs = JSON.parse(next()); } catch (e) { usage(`--args is not valid JSON: ${e.message}`); }
    if (toolArgs === null || typeof toolArgs !== "object" || Array.isArray(toolArgs)) usage("--args must be a JSON object");
  } else if (a === "--timeout") timeoutS = Number(next());
  else if (a === "--answer") {
    try { answers = JSON.parse(next()); } catch (e) { usage(`--answer is not valid JSON: ${e.message}`); }
  }
  else if (a === "--stdio") {
    stdio = argv.slice(i + 1);
    if (stdio.length === 0) usage("--stdio needs a command");
    break;
  } else usage(`unknown argument ${a}`);
}
if (!url === !stdio) usage("exactly one of --url or --stdio is required");

const target = url ?? stdio.join(" ");
let transport;
if (url) {
  transport = new StreamableHTTPClientTransport(new URL(url));
} else {
  transport = new StdioClientTransport({
    command: stdio[0],
    args: stdio.slice(1),
    env: Object.fromEntries(Object.entries(process.env).filter(([, v]) => v !== undefined)),
    stderr: "inherit",
  });
}

// Capture the negotiated protocol version (Client calls transport.setProtocolVersion after initialize).
let negotiated = null;
const origSetPV = transport.setProtocolVersion?.bind(transport);
transport.setProtocolVersion = (v) => { negotiated = v; origSetPV?.(v); };

const capabilities = {};
if (answers?.elicit) capabilities.elicitation = {};
if (answers?.sample) capabilities.sampling = {};
if (answers?.roots) capabilities.roots = {};
const client = new Client({ name: "ts-interop-client", version: "1.0.0" }, { capabilities });
const asked = [];
if (answers?.elicit) {
  client.setRequestHandler(ElicitRequestSchema, async () => {
    asked.push("elicitation/create");
    return { action: "accept", content: answers.elicit };
  });
}
if (answers?.sample) {
  client.setRequestHandler(CreateMessageRequestSchema, async () => {
    asked.push("sampling/createMessage");
    return { role: "assistant", content: { type: "text", text: answers.sample }, model: "ts-interop" };
  });
}
if (answers?.roots) {
  client.setRequestHandler(ListRootsRequestSchema, async () => {
    asked.push("roots/list");
    return { roots: answers.roots };
  });
}
const reqOpts = { timeout: timeoutS * 1000 };

const watchdog = setTimeout(() => {
  console.error(`ts_client FAILED against ${target}: overall timeout after ${timeoutS * 2 + 10}s`);
  process.exit(1);
}, (timeoutS * 2 + 10) * 1000);

try {
  await client.connect(transport, reqOpts);
  const names = [];
  let cursor;
  for (let n = 0; n < 1000; n++) {
    const page = await client.listTools(cursor ? { cursor } : {}, reqOpts);
    for (const t of page.tools) names.push(t.name);
    cursor = page.nextCursor;
    if (!cursor) break;
  }
  const out = {
    tools: names,
    result: null,
    isError: null,
    structuredContent: null,
    protocolVersion: negotiated ?? transport.protocolVersion ?? null,
    serverInfo: client.getServerVersion() ?? null,
  };
  if (tool) {
    const res = await client.callTool({ name: tool, arguments: toolArgs }, undefined, reqOpts);
    out.result = res.content ?? [];
    out.isError = Boolean(res.isError);
    out.structuredContent = res.structuredContent ?? null;
  }
  out.asked = asked;
  process.stdout.write(JSON.stringify(out) + "\n");
  clearTimeout(watchdog);
  await client.close().catch(() => {});
  process.exit(0);
} catch (e) {
  console.error(`ts_client FAILED against ${target}: ${e?.stack ?? e}`);
  await client.close().catch(() => {});
  process.exit(1);
}

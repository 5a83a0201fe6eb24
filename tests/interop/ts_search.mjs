#!/usr/bin/env node
// Search-mode client on the official TypeScript SDK (@modelcontextprotocol/sdk 1.x).
//
// Usage: node tests/interop/ts_search.mjs --url URL --query TEXT --args JSON
//
// Lists the tools (the gateway's two, in search mode), calls gateway__search_tools with
// --query, calls the first match through gateway__call_tool with --args, then calls it
// again directly by name, and prints ONE JSON line to stdout:
//   {"tools":[...names], "found":[...names], "foundSchema":{...}, "textMatches":bool,
//    "viaGateway":[...content], "direct":[...content]}
// Exit 0 on success; on failure prints a message to stderr and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const argv = process.argv.slice(2);
let url = null, query = null, toolArgs = {};
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const next = () => argv[++i];
  if (a === "--url") url = next();
  else if (a === "--query") query = next();
  else if (a === "--args") toolArgs = JSON.parse(next());
  else { console.error(`ts_search: unknown argument ${a}`); process.exit(2); }
}
if (!url || !query) { console.error("ts_search: --url and --query are required"); process.exit(2); }

const client = new Client({ name: "ts-search-client", version: "1.0.0" });
try {
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  const listed = await client.listTools();
  // The SDK checks structuredContent against the tool's outputSchema from the list.
  const found = await client.callTool({ name: "gateway__search_tools", arguments: { query, limit: 5 } });
  const matches = found.structuredContent?.tools ?? [];
  if (matches.length === 0) throw new Error(`the search found nothing: ${JSON.stringify(found)}`);
  const first = matches[0].name;
  const via = await client.callTool({ name: "gateway__call_tool", arguments: { name: first, arguments: toolArgs } });
  const direct = await client.callTool({ name: first, arguments: toolArgs });
  console.log(JSON.stringify({
    tools: listed.tools.map((t) => t.name),
    found: matches.map((m) => m.name),
    foundSchema: matches[0].inputSchema,
    textMatches: JSON.stringify(JSON.parse(found.content[0].text)) === JSON.stringify(found.structuredContent),
    viaGateway: via.content,
    direct: direct.content,
  }));
  await client.close();
  process.exit(0);
} catch (e) {
  console.error(`ts_search: ${e?.stack ?? e}`);
  process.exit(1);
}

#!/usr/bin/env python3
"""Search-mode client on the official Python SDK (mcp 2.x `mcp.Client`) over Streamable HTTP.

Usage:
  .venv/bin/python tests/interop/py_search.py URL --query TEXT --args JSON [--mode legacy|auto]

Lists the tools (the gateway's two, in search mode), calls gateway__search_tools with
--query, calls the first match through gateway__call_tool with --args, then calls it again
directly by name, and prints ONE JSON line to stdout:
  {"tools":[...names], "found":[...names], "foundSchema":{...}, "textMatches":bool,
   "viaGateway":[...content], "direct":[...content], "protocolVersion":"...", "mode":"..."}
Exit 0 on success; on failure prints a message to stderr and exits 1.
"""

import argparse
import json
import sys

from interop_run import report


async def run(args: argparse.Namespace) -> dict:
    from mcp import Client

    tool_args = json.loads(args.args)
    async with Client(args.url, mode=args.mode, read_timeout_seconds=args.timeout) as client:
        listed = await client.list_tools()
        found = await client.call_tool("gateway__search_tools", {"query": args.query, "limit": 5})
        dumped = found.model_dump(mode="json", by_alias=True, exclude_none=True)
        structured = dumped.get("structuredContent") or {}
        text = dumped["content"][0]["text"]
        matches = structured.get("tools", [])
        if not matches:
            raise RuntimeError("the search found nothing: %r" % dumped)
        first = matches[0]["name"]
        via = await client.call_tool("gateway__call_tool", {"name": first, "arguments": tool_args})
        direct = await client.call_tool(first, tool_args)
        return {
            "tools": [t.name for t in listed.tools],
            "found": [m["name"] for m in matches],
            "foundSchema": matches[0].get("inputSchema"),
            "textMatches": json.loads(text) == structured,
            "viaGateway": via.model_dump(mode="json", by_alias=True, exclude_none=True).get("content", []),
            "direct": direct.model_dump(mode="json", by_alias=True, exclude_none=True).get("content", []),
            "protocolVersion": client.protocol_version,
            "mode": args.mode,
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--query", required=True)
    p.add_argument("--args", default="{}")
    p.add_argument("--mode", choices=["legacy", "auto"], default="auto")
    p.add_argument("--timeout", type=float, default=30.0)
    return report("py_search", run, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())

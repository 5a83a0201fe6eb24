#!/usr/bin/env python3
"""Interop client on the official Python SDK (mcp 2.x `mcp.Client`) over Streamable HTTP.

Usage:
  .venv/bin/python tests/interop/py_client.py URL [--mode legacy|auto] [--tool NAME] [--args JSON]
                                              [--timeout SECONDS]

Connects to URL (e.g. http://127.0.0.1:8080/mcp), lists all tools (following nextCursor),
optionally calls --tool with --args, and prints ONE JSON line to stdout:
  {"tools":[...names], "result":[...content] | null, "isError":bool|null,
   "structuredContent":...|null, "protocolVersion":"...", "serverInfo":{...}|null, "mode":"...",
   "connectSeconds":float}   (connectSeconds: time to connect + handshake, incl. any probe)
Exit 0 on success; on failure prints a message to stderr and exits 1 (2 for usage errors).

mode=legacy: initialize handshake only. mode=auto (SDK default): first POSTs a
`server/discover` probe (protocol 2026-07-28), then falls back to initialize on any
JSON-RPC error / HTTP 404 / other 4xx.
"""

import argparse
import asyncio
import json
import sys
import time


async def run(args: argparse.Namespace) -> dict:
    from mcp import Client

    tool_args = json.loads(args.args) if args.args else {}
    if not isinstance(tool_args, dict):
        raise SystemExit("--args must be a JSON object")
    started = time.monotonic()
    async with Client(args.url, mode=args.mode, read_timeout_seconds=args.timeout) as client:
        connect_seconds = time.monotonic() - started
        names: list[str] = []
        cursor = None
        for _ in range(1000):
            page = await client.list_tools(cursor=cursor)
            names.extend(t.name for t in page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        out: dict = {
            "tools": names,
            "result": None,
            "isError": None,
            "structuredContent": None,
            "protocolVersion": client.protocol_version,
            "serverInfo": client.server_info.model_dump(mode="json", by_alias=True, exclude_none=True)
            if client.server_info
            else None,
            "mode": args.mode,
            "connectSeconds": round(connect_seconds, 3),
        }
        if args.tool:
            res = await client.call_tool(args.tool, tool_args)
            dumped = res.model_dump(mode="json", by_alias=True, exclude_none=True)
            out["result"] = dumped.get("content", [])
            out["isError"] = bool(dumped.get("isError", False))
            out["structuredContent"] = dumped.get("structuredContent")
        return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--mode", choices=["legacy", "auto"], default="auto")
    p.add_argument("--tool", default=None)
    p.add_argument("--args", default="{}", help="tool arguments as a JSON object")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request read timeout in seconds")
    args = p.parse_args()
    try:
        out = asyncio.run(asyncio.wait_for(run(args), timeout=args.timeout * 2 + 10))
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - report anything, incl. ExceptionGroup
        msg = repr(e)
        if isinstance(e, BaseExceptionGroup):
            msg += " :: " + "; ".join(repr(x) for x in e.exceptions)
        print(f"py_client FAILED ({args.mode}) against {args.url}: {msg}", file=sys.stderr)
        return 1
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A client on the official Python SDK (mcp 2.x `mcp.Client`) that calls one tool with a
bearer token, for the per-client secrets tests (tests/it/client_secrets.rs).

Usage:
  .venv/bin/python tests/interop/py_whoami.py URL --token T --tool NAME [--args JSON]
      [--mode legacy|auto]

Connects over Streamable HTTP with `Authorization: Bearer T` on every request, calls the
tool, and prints ONE JSON line to stdout:
  {"content": [...], "isError": bool, "protocolVersion": "..."}
or, when the call is answered with a JSON-RPC error, {"error": "message"}.
Exit 0 either way; on any other failure prints a message to stderr and exits 1.
"""

import argparse
import json
import sys

from interop_run import report


async def run(args: argparse.Namespace) -> dict:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {args.token}"}, timeout=args.timeout)
    async with http:
        transport = streamable_http_client(args.url, http_client=http)
        async with Client(transport, mode=args.mode, read_timeout_seconds=args.timeout) as client:
            try:
                r = await client.call_tool(args.tool, json.loads(args.args))
            except MCPError as e:
                return {"error": str(e), "protocolVersion": client.protocol_version}
            d = r.model_dump(mode="json", by_alias=True, exclude_none=True)
            return {
                "content": d.get("content", []),
                "isError": bool(d.get("isError")),
                "protocolVersion": client.protocol_version,
            }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--token", required=True)
    p.add_argument("--tool", required=True)
    p.add_argument("--args", default="{}")
    p.add_argument("--mode", choices=["legacy", "auto"], default="legacy")
    p.add_argument("--timeout", type=float, default=30.0)
    return report("py_whoami", run, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())

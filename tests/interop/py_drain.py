#!/usr/bin/env python3
"""A call in flight while the gateway shuts down, on the official Python SDK (mcp 2.x).

Usage: .venv/bin/python tests/interop/py_drain.py URL TOOL ARGS_JSON

Connects in legacy (initialize) mode, so the SDK keeps a GET stream open; prints
`calling` (flushed) right before it calls TOOL, then ONE JSON line with the result's
content and isError. Any exception (an ExceptionGroup from the SDK's task group
included) is printed to stderr, exit 1.
"""

import asyncio
import json
import sys


async def run(url: str, tool: str, args: dict) -> dict:
    from mcp import Client

    async with Client(url, mode="legacy", read_timeout_seconds=30) as client:
        # Listed first, as a client does: call_tool then validates against its cache
        # (with no cache it would list the tools after the answer, on a new connection).
        await client.list_tools()
        print("calling", flush=True)
        res = await client.call_tool(tool, args)
        dumped = res.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {"result": dumped.get("content", []), "isError": bool(dumped.get("isError", False))}


def main() -> int:
    url, tool, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    try:
        out = asyncio.run(asyncio.wait_for(run(url, tool, args), timeout=60))
    except BaseException as e:  # noqa: BLE001 - report anything, incl. ExceptionGroup
        msg = repr(e)
        if isinstance(e, BaseExceptionGroup):
            msg += " :: " + "; ".join(repr(x) for x in e.exceptions)
        print(f"py_drain: {msg}", file=sys.stderr)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Interop client on the official Python SDK (mcp 2.x) speaking 2026-07-28 to the gateway:
multi round-trip requests and subscriptions/listen, driven by the SDK itself.

Usage: .venv/bin/python tests/interop/py_stateless.py URL ELICIT_TOOL ADD_TOOL

Connects in auto mode (server/discover), calls ELICIT_TOOL {message} with an elicitation
callback that accepts {"name": "sdk-user"} (the SDK answers the gateway's input_required
and retries with requestState), then opens a listen stream for tools list changes, calls
ADD_TOOL {name} to change the tool list and waits for the event. Prints ONE JSON line:
  {"protocolVersion", "elicited": [messages asked], "result": text, "honored": {...},
   "event": "ToolsListChanged"}
Exit 0 on success; on failure prints a message to stderr and exits 1.
"""

import asyncio
import json
import sys


async def run(url: str, elicit_tool: str, add_tool: str) -> dict:
    import mcp_types as types
    from mcp import Client

    asked: list[str] = []

    async def on_elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "sdk-user"})

    async with Client(url, mode="auto", read_timeout_seconds=20, elicitation_callback=on_elicit) as client:
        res = await client.call_tool(elicit_tool, {"message": "Who are you?"})
        dumped = res.model_dump(mode="json", by_alias=True, exclude_none=True)
        text = dumped.get("content", [{}])[0].get("text")
        async with client.listen(tools_list_changed=True) as sub:
            honored = sub.honored.model_dump(mode="json", by_alias=True, exclude_none=True)
            await client.call_tool(add_tool, {"name": "sdk_added"})
            event = await asyncio.wait_for(sub.__anext__(), timeout=20)
        return {
            "protocolVersion": client.protocol_version,
            "elicited": asked,
            "result": text,
            "honored": honored,
            "event": type(event).__name__,
        }


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        out = asyncio.run(run(sys.argv[1], sys.argv[2], sys.argv[3]))
    except Exception as e:  # report, do not trace: the Rust test shows stderr
        print(f"py_stateless failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Consent through URL elicitation, on the official Python SDK client (mcp 2.x `mcp.Client`).

Usage:
  .venv/bin/python tests/interop/py_consent.py URL --token TOKEN --ask TOOL --then TOOL [--timeout S]

Connects to the gateway at URL as the client of bearer TOKEN, declaring URL elicitation
(an elicitation callback), and calls --ask, which must fail with -32042 "URL elicitation
required" (`UrlElicitationRequiredError`). Then it talks over stdin/stdout, one JSON line
each way:
  out {"event": "elicitation", "url", "elicitationId", "message", "code"}
  (the test opens the URL as a browser would)
  out {"event": "complete", "elicitationId"}     once notifications/elicitation/complete came
  out {"event": "result", "tools", "content", "structuredContent", "isError"}
      after calling --then (waiting for it to be listed: a tools/list_changed first)
Exit 0 on success; on failure a message on stderr and exit 1.
"""

import argparse
import asyncio
import json
import sys


def say(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


async def run(args: argparse.Namespace) -> None:
    import mcp_types as types
    from mcp import Client, MCPError, UrlElicitationRequiredError
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    completed: asyncio.Queue = asyncio.Queue()
    changed = asyncio.Event()

    async def on_message(message) -> None:
        m = getattr(message, "root", message)
        if isinstance(m, types.ElicitCompleteNotification):
            await completed.put(m.params.elicitation_id)
        elif isinstance(m, types.ToolListChangedNotification):
            changed.set()

    async def on_elicit(context, params):
        # Form or URL elicitation asked as a request: not expected here (the gateway
        # answers with -32042 instead).
        return types.ElicitResult(action="decline")

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {args.token}"})
    async with http:
        transport = streamable_http_client(args.url, http_client=http)
        async with Client(
            transport,
            mode="legacy",
            read_timeout_seconds=args.timeout,
            elicitation_callback=on_elicit,
            message_handler=on_message,
        ) as client:
            try:
                await client.call_tool(args.ask, {})
            except MCPError as e:
                if e.code != -32042:
                    raise SystemExit(f"expected -32042, got {e.code}: {e.message}")
                err = UrlElicitationRequiredError.from_error(e.error)
                el = err.elicitations[0]
                say(
                    {
                        "event": "elicitation",
                        "code": e.code,
                        "url": el.url,
                        "elicitationId": el.elicitation_id,
                        "message": el.message,
                        "mode": el.mode,
                    }
                )
            else:
                raise SystemExit(f"{args.ask} succeeded without consent")
            done = await asyncio.wait_for(completed.get(), timeout=args.timeout)
            say({"event": "complete", "elicitationId": done})
            names: list[str] = []
            for _ in range(2):
                names = [t.name for t in (await client.list_tools()).tools]
                if args.then in names:
                    break
                await asyncio.wait_for(changed.wait(), timeout=args.timeout)
            res = await client.call_tool(args.then, {})
            d = res.model_dump(mode="json", by_alias=True, exclude_none=True)
            say(
                {
                    "event": "result",
                    "tools": names,
                    "content": d.get("content", []),
                    "structuredContent": d.get("structuredContent"),
                    "isError": bool(d.get("isError", False)),
                }
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--token", required=True)
    p.add_argument("--ask", required=True)
    p.add_argument("--then", required=True)
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    try:
        asyncio.run(asyncio.wait_for(run(args), timeout=args.timeout * 3 + 10))
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - report anything, incl. ExceptionGroup
        msg = repr(e)
        if isinstance(e, BaseExceptionGroup):
            msg += " :: " + "; ".join(repr(x) for x in e.exceptions)
        print(f"py_consent: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A long-lived client on the official Python SDK (mcp 2.x `mcp.Client`, legacy mode),
driven one command per stdin line, for the cluster tests (tests/it/cluster_e2e.rs).

Usage: .venv/bin/python tests/interop/py_cluster.py URL

Keeps ONE `Client(URL, mode="legacy")` for its whole life: every command goes through the
same session, so a re-initialize would show (the gateways log each session they open).
Prints `{"ready": true, "sessionId": ...}` once connected, then one JSON line per command:

  list                    {"tools": [names]}            (tools/list, not the SDK's cache)
  call NAME ARGS_JSON     {"content": [...], "isError": bool}
  subscribe URI           {"ok": true}
  level LEVEL             {"ok": true}                  (logging/setLevel)
  elicit                  calc__ask_elicit; the client accepts with {"name": "Ada"}:
                          {"content": [...], "isError": bool, "asked": N}
  progress                calc__slow with 3 steps and a progress callback:
                          {"progress": N, "content": [...], "isError": bool}
  notifications           {"notifications": [{"method", "params"}...]} received so far
  session                 {"sessionId": ...} (the one the SDK sends now)
  quit                    closes the client (DELETE of the session): {"closed": true}

A command that fails prints {"error": "..."} and the client goes on. The SDK's own
warnings go to stderr.
"""

import asyncio
import json
import logging
import sys
import time


class SessionIds(logging.Handler):
    """The SDK logs each session id it receives; the last one is the session in use."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        prefix = "Received session ID: "
        if msg.startswith(prefix):
            self.last = msg[len(prefix):].strip()


def out(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def describe(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}"
    if isinstance(e, BaseExceptionGroup):
        msg += " :: " + "; ".join(describe(x) for x in e.exceptions)
    return msg


async def main(url: str) -> int:
    from mcp import Client
    import mcp.types as types

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="py_cluster %(levelname)s %(name)s: %(message)s")
    ids = SessionIds()
    sdk_log = logging.getLogger("mcp.client.streamable_http")
    sdk_log.setLevel(logging.INFO)
    sdk_log.addHandler(ids)

    notes: list[dict] = []
    asked = 0

    async def on_message(message) -> None:
        if isinstance(message, Exception):
            print(f"py_cluster: transport: {describe(message)}", file=sys.stderr, flush=True)
            return
        method = getattr(message, "method", type(message).__name__)
        params = getattr(message, "params", None)
        dumped = params.model_dump(mode="json", by_alias=True, exclude_none=True) if params is not None else None
        notes.append({"method": method, "params": dumped, "at": time.monotonic()})

    async def on_elicit(context, params):
        nonlocal asked
        asked += 1
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def on_log(params) -> None:
        # Also teed to on_message, which records it.
        pass

    def result(res) -> dict:
        dumped = res.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {"content": dumped.get("content", []), "isError": bool(dumped.get("isError", False))}

    loop = asyncio.get_running_loop()
    async with Client(
        url,
        mode="legacy",
        read_timeout_seconds=15,
        message_handler=on_message,
        logging_callback=on_log,
        elicitation_callback=on_elicit,
    ) as client:
        out({"ready": True, "sessionId": ids.last})
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return 0
            line = line.strip()
            if not line:
                continue
            cmd, _, rest = line.partition(" ")
            try:
                if cmd == "list":
                    page = await client.list_tools(cache_mode="refresh")
                    out({"tools": [t.name for t in page.tools]})
                elif cmd == "call":
                    name, _, args = rest.partition(" ")
                    out(result(await client.call_tool(name, json.loads(args or "{}"))))
                elif cmd == "subscribe":
                    await client.subscribe_resource(rest)
                    out({"ok": True})
                elif cmd == "level":
                    await client.set_logging_level(rest)
                    out({"ok": True})
                elif cmd == "elicit":
                    before = asked
                    res = await client.call_tool("calc__ask_elicit", {"message": "name?"})
                    out({**result(res), "asked": asked - before})
                elif cmd == "progress":
                    seen: list[float] = []

                    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                        seen.append(progress)

                    res = await client.call_tool(
                        "calc__slow", {"seconds": 0.6, "steps": 3}, progress_callback=on_progress
                    )
                    out({**result(res), "progress": len(seen)})
                elif cmd == "notifications":
                    out({"notifications": [{"method": n["method"], "params": n["params"]} for n in notes]})
                elif cmd == "session":
                    out({"sessionId": ids.last})
                elif cmd == "quit":
                    break
                else:
                    out({"error": f"unknown command {cmd!r}"})
            except Exception as e:  # noqa: BLE001 - a failed command is reported, the client goes on
                out({"error": describe(e)})
    out({"closed": True})
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(asyncio.run(main(sys.argv[1])))
    except BaseException as e:  # noqa: BLE001 - report anything, incl. ExceptionGroup
        if isinstance(e, SystemExit):
            raise
        print(f"py_cluster: {describe(e)}", file=sys.stderr, flush=True)
        out({"error": describe(e), "fatal": True})
        sys.exit(1)

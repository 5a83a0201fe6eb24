"""What the interop scripts share: run the script's coroutine with a deadline, print its
result as one JSON line on stdout, or report any failure (an ExceptionGroup's members too)
on stderr with exit status 1."""

import asyncio
import json
import sys


def report(name: str, run, args) -> int:
    try:
        out = asyncio.run(asyncio.wait_for(run(args), timeout=args.timeout * 2 + 10))
    except BaseException as e:  # noqa: BLE001 - report anything, incl. ExceptionGroup
        msg = repr(e)
        if isinstance(e, BaseExceptionGroup):
            msg += " :: " + "; ".join(repr(x) for x in e.exceptions)
        print(f"{name}: " + msg, file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0

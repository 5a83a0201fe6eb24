#!/usr/bin/env bash
# Sanity check of the interop clients against the SDK fixture servers directly (no gateway).
# Requires scripts/setup-test-deps to have run. Prints 'N passed, N failed'; exit 1 on failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY=.venv/bin/python
pass=0; fail=0
check() { # name, expected substring, command...
  local name="$1" want="$2"; shift 2
  local out
  if out="$("$@" 2>/tmp/interop_selftest.err)" && [[ "$out" == *"$want"* ]]; then
    pass=$((pass+1)); echo "ok   $name"
  else
    fail=$((fail+1)); echo "FAIL $name: out=$out"; tail -5 /tmp/interop_selftest.err
  fi
}
PORT="$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
$PY tests/fixtures/py_sdk_server.py --http "$PORT" 2>/tmp/interop_pysrv.log &
SRV=$!
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null' EXIT
for _ in $(seq 50); do
  (echo > /dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.1
done
URL="http://127.0.0.1:$PORT/mcp"
check py-legacy '"result":[{"type":"text","text":"5"}]' $PY tests/interop/py_client.py "$URL" --mode legacy --tool py_add --args '{"a":2,"b":3}'
check py-auto '"protocolVersion":"2026-07-28"' $PY tests/interop/py_client.py "$URL" --mode auto --tool py_echo --args '{"text":"hi"}'
check ts-http '"text":"5"' node tests/interop/ts_client.mjs --url "$URL" --tool py_add --args '{"a":2,"b":3}'
check ts-stdio-ts '"text":"5"' node tests/interop/ts_client.mjs --tool ts_add --args '{"a":2,"b":3}' --stdio node tests/fixtures/ts_sdk_server.mjs
check ts-stdio-py '"text":"hi"' node tests/interop/ts_client.mjs --tool py_echo --args '{"text":"hi"}' --stdio $PY tests/fixtures/py_sdk_server.py
check ts-stdio-mock '"text":"5"' node tests/interop/ts_client.mjs --tool add --args '{"a":2,"b":3}' --stdio python3 tests/fixtures/mock_server.py --tools 5 --page-size 3
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

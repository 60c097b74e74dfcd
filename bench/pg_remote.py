"""One PostgreSQL peer's workload, run in this interpreter for a bench run in another.

``python -m bench.pg_remote '{"peer": "oban", "method": "drain", "args": [URL, 20000, 4]}'``
runs that method of the peer's adapter (:mod:`bench.pg_peers`) here and prints
``{"result": ...}`` as the last line of its standard output. The bench runs
oban this way when it runs on Python 3.11 (oban needs 3.12):
:class:`bench.pg_oban.Remote` is the caller.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from bench.pg_peers import PG_PEERS

# what a caller may ask for: the workloads the runner measures, and the untimed setup
METHODS = frozenset({"version", "setup", "enqueue_one", "drain", "processes", "latency"})


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.pg_remote REQUEST_JSON", file=sys.stderr)
        return 2
    request: dict[str, Any] = json.loads(argv[0])
    peer = PG_PEERS.get(request.get("peer", ""))
    method = request.get("method", "")
    if peer is None or method not in METHODS:
        print(
            f"bench.pg_remote: no peer {request.get('peer')!r} or method {method!r}",
            file=sys.stderr,
        )
        return 2
    if not peer.available():
        print(
            f"bench.pg_remote: {peer.name} is not installed in {sys.executable} "
            f"(Python {sys.version.split()[0]})",
            file=sys.stderr,
        )
        return 2
    result = getattr(peer, method)(*request.get("args", []))
    print(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

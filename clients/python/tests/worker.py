"""A worker process for the crash tests: it runs one tool call through the loop and is
SIGKILLed by the test while the tool runs.

    python3 worker.py ENDPOINT KEY TICKETS_FILE {after_effect|before_effect}

The "downstream system" is TICKETS_FILE: one line per ticket made, holding its id and
the external id (the idempotency key) the probe finds it by.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import idemkv  # noqa: E402


def main() -> None:
    endpoint, key, tickets, when = sys.argv[1:5]
    client = idemkv.Client(endpoint, tenant="acme", lease_ttl=1)

    def create_ticket() -> dict[str, str]:
        print("TOOL_STARTED", flush=True)
        if when == "after_effect":
            with open(tickets, "a") as f:
                f.write(f"LIN-worker {key}\n")
                f.flush()
                os.fsync(f.fileno())
            print("EFFECT_DONE", flush=True)
        time.sleep(60)  # the answer never comes back: SIGKILL lands here
        return {"id": "unreachable"}

    client.do(create_ticket, key=key, tool="create_ticket", effect={"title": "Outage X", "ext": key})


if __name__ == "__main__":
    main()

"""The Python worker of the cross-language test: one create_ticket call, as a runtime
would make it (key from the operation), printing what came back. FORM is how the tool
takes its arguments: "object" (one dict, as a framework hands a tool its arguments) or
"kwargs" (keyword arguments).

    python3 worker.py ENDPOINT OPERATION TICKETS_FILE FORM
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "src"))

import idemkv  # noqa: E402


def main() -> None:
    endpoint, op, tickets, form = sys.argv[1:5]
    client = idemkv.Client(endpoint, tenant="acme")

    def effect() -> dict[str, str]:
        with open(tickets, "a") as f:
            f.write(f"{op} python\n")
        return {"id": f"TCK-{op}"}

    @client.idempotent(tool="create_ticket", outcome=True)
    def create_ticket(title: str, severity: str) -> dict[str, str]:
        return effect()

    @client.idempotent(tool="create_ticket", outcome=True)
    def create_ticket_from(args: dict[str, str]) -> dict[str, str]:
        return effect()

    with idemkv.operation(op):
        if form == "object":
            out = create_ticket_from({"title": "Outage X", "severity": "sev1"})
        else:
            out = create_ticket(title="Outage X", severity="sev1")
    print(json.dumps({"worker": "python", "replayed": out.replayed, "remote_id": out.receipt["remote_id"],
                      "fingerprint": out.fingerprint}))


if __name__ == "__main__":
    main()

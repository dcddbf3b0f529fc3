"""An agent's create_ticket tool, made exactly-once by idemkv: the Python version.

Agent frameworks (the OpenAI Agents SDK, LangGraph, CrewAI, Pydantic AI, LlamaIndex)
take plain Python functions as tools and call them with the model's arguments. Wrapping
such a function for idemkv is one decorator line; the framework never knows.

The "ticket API" below is in memory and misbehaves the way real ones do: once, it
creates the ticket and then times out before answering. Run against a node:

    go run ./cmd/idemkv serve &                 # 127.0.0.1:7420
    python3 examples/python/tickets.py          # or IDEMKV_ENDPOINTS=host:port,...

With the package installed (pip install ./clients/python) or from the repository (the
script finds clients/python/src on its own).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))

import idemkv  # noqa: E402


class TicketAPI:
    """A ticket system (think Linear or Jira) that finds tickets by an external id."""

    def __init__(self) -> None:
        self.tickets: dict[str, dict[str, str]] = {}
        self.calls = 0
        self.time_out_after_next_create = False
        self.lock = threading.Lock()

    def create(self, project: str, title: str, external_id: str) -> dict[str, str]:
        with self.lock:
            self.calls += 1
            if project == "ARCHIVED":
                raise idemkv.Permanent(f"project {project} is archived", code="project_archived")
            tid = f"{project}-{len(self.tickets) + 1}"
            ticket = {"id": tid, "url": f"https://tickets.example/{tid}", "title": title, "external_id": external_id}
            self.tickets[tid] = ticket
            if self.time_out_after_next_create:
                self.time_out_after_next_create = False
                raise TimeoutError("the ticket API did not answer in 10s")  # ... but it made the ticket
        time.sleep(0.2)  # a real API takes a while
        return ticket

    def find(self, external_id: str) -> Optional[dict[str, str]]:
        with self.lock:
            return next((t for t in self.tickets.values() if t["external_id"] == external_id), None)


API = TicketAPI()
client = idemkv.Client(os.environ.get("IDEMKV_ENDPOINTS", "127.0.0.1:7420").split(","), tenant="tenant_42",
                       lease_ttl=1)  # a short lease, so that the crash below recovers quickly


def find_ticket(args: dict[str, Any]) -> Optional[dict[str, str]]:
    """The probe: after an attempt died, did its ticket get made?"""
    return API.find(external_id=args["approval_id"])


# The tool as an agent framework registers it, and the one-line wrap above it.
@idemkv.idempotent(key=lambda a: f"{a['conversation_id']}:{a['approval_id']}:create_ticket", effect=lambda a: {"project": a["project"], "title": a["title"]}, tool="create_ticket", side_effect="non_idempotent", probe=find_ticket, client=client)  # noqa: E501
def create_ticket(args: dict[str, Any]) -> dict[str, str]:
    """Create an incident ticket in the given project."""
    return API.create(project=args["project"], title=args["title"], external_id=args["approval_id"])


def record(args: dict[str, Any]) -> str:
    key = f"{args['conversation_id']}:{args['approval_id']}:create_ticket"
    rec = client.get("tenant_42", key) or {}
    return f"record={rec.get('status', 'absent')} attempts={rec.get('attempts', 0)}"


def main() -> None:
    run = uuid.uuid4().hex[:6]  # fresh keys on every run of the example
    call = {"conversation_id": f"conv_{run}", "approval_id": "approval_17", "project": "OPS",
            "title": "Outage X: API 5xx", "trace_id": "4bf92f35"}

    t = create_ticket(call)
    print(f"1. the model calls the tool:           ticket {t['id']}  api calls={API.calls}  {record(call)}")

    t = create_ticket(dict(call, trace_id="77ab01"))  # a retry; volatile fields differ
    print(f"2. the model retries the same call:    ticket {t['id']}  api calls={API.calls}  (replayed)")

    # A queue redelivers one approved action to two workers at once.
    redelivered = dict(call, approval_id="approval_18")
    got: list[str] = []
    workers = [threading.Thread(target=lambda: got.append(create_ticket(redelivered)["id"])) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(f"3. two workers, one redelivery:        tickets {got}  api calls={API.calls}  {record(redelivered)}")

    # The API makes the ticket and then times out: the outcome is unknown.
    flaky = dict(call, approval_id="approval_19")
    API.time_out_after_next_create = True
    try:
        create_ticket(flaky)
    except idemkv.OutcomeUnknownError as e:
        print(f"4. the API times out after creating:   {e.kind}  ({type(e.cause).__name__})  {record(flaky)}")
    t = create_ticket(flaky)  # the retry waits out the 1 s lease, then the probe finds the ticket
    print(f"   the retry recovers through the probe: ticket {t['id']}  api calls={API.calls}  {record(flaky)}")

    try:
        create_ticket(dict(call, title="Outage Y"))  # same key, another effect
    except idemkv.ConflictError as e:
        print(f"5. same key, different title:          {e.kind}  ({e.conflict['reason']}, "
              f"existing {e.conflict.get('existing_remote_id')})")

    archived = dict(call, approval_id="approval_20", project="ARCHIVED")
    for attempt in ("first", "retry"):
        try:
            create_ticket(archived)
        except idemkv.StoredFailureError as e:
            print(f"6. archived project, {attempt:5}:           {e.kind}  code={e.code}  replayed={e.replayed}  "
                  f"api calls={API.calls}")

    print(f"tickets made: {len(API.tickets)} (operations that made one: 3; tool calls: 9; "
          f"ticket API calls: {API.calls})")
    client.close()


if __name__ == "__main__":
    main()

"""Recipes: idemkv under the tool decorators of LangGraph / LangChain and the OpenAI
Agents SDK, with the key from the framework's run and tool-call ids.

The frameworks cannot be installed here (no package index), so each recipe is written
against the *structural contract* it relies on, which the stand-ins below reproduce and
this script exercises. With the real framework, delete the stand-in and import the
decorator; the recipe does not change. The contract, per framework:

LangGraph / LangChain (langchain_core.tools.tool, langgraph.prebuilt.ToolNode):
    a tool is invoked with a ToolCall ``{"name", "args", "id", "type": "tool_call"}``
    and a RunnableConfig whose ``config["configurable"]["thread_id"]`` names the
    conversation; a ``RunnableConfig``-annotated parameter receives the config and an
    ``InjectedToolCallId``-annotated one the call's id. On resume after a crash,
    LangGraph re-runs the interrupted tool node from its checkpoint with the same
    AIMessage, hence the same tool-call ids: the same keys, so the effect replays.

OpenAI Agents SDK (agents.function_tool):
    a function tool whose first parameter is a ``ToolContext`` gets
    ``ctx.tool_call_id`` (and ``ctx.context``, the run's own context object); the
    remaining parameters are the model's arguments. A rerun of the same run (the
    SDK's RunState, or your own retry of the turn) gets the same tool_call_id from the
    model's response that is replayed.

The recipe in both: the framework's decorator outside, an ``idemkv.operation`` built
from the thread/run id and the tool-call id, and the ``@idempotent`` function inside
taking only the business arguments (so the effect is exactly them: no config, no
context object, no ids in the fingerprint).

    go run ./cmd/idemkv serve &
    python3 examples/python/frameworks.py     # or IDEMKV_ENDPOINTS=host:port,...
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))

import idemkv  # noqa: E402

# ---- the business tool, once: idemkv inside every framework ----

TICKETS: list[dict[str, str]] = []  # the downstream system's effects


def make_create_ticket(client: Any) -> Callable[..., dict[str, str]]:
    @client.idempotent(tool="create_ticket", probe=lambda title, severity="sev3": next(
        (t for t in TICKETS if t["title"] == title), None))
    def create_ticket(title: str, severity: str = "sev3") -> dict[str, str]:
        t = {"id": f"LIN-{len(TICKETS) + 1}", "title": title, "severity": severity}
        TICKETS.append(t)
        return t

    return create_ticket


# ---- LangGraph / LangChain: a stand-in for @tool and ToolNode's call ----


def langchain_tool(fn: Callable[..., Any]) -> Any:
    """The part of langchain_core.tools.tool this recipe relies on: invoke(tool_call,
    config) calls fn with the call's args, the config and the tool-call id."""

    class Tool:
        name = fn.__name__

        def invoke(self, call: dict[str, Any], config: dict[str, Any]) -> Any:
            return fn(**call["args"], config=config, tool_call_id=call["id"])

    return Tool()


def langgraph_recipe(create_ticket: Callable[..., dict[str, str]]) -> Any:
    @langchain_tool
    def open_ticket(title: str, severity: str = "sev3", *, config: dict[str, Any], tool_call_id: str) -> dict[str, str]:
        """Open a ticket. (With LangChain: `config: RunnableConfig` and
        `tool_call_id: Annotated[str, InjectedToolCallId]`.)"""
        with idemkv.operation(f"{config['configurable']['thread_id']}:{tool_call_id}"):
            return create_ticket(title=title, severity=severity)

    return open_ticket


# ---- OpenAI Agents SDK: a stand-in for @function_tool and its ToolContext ----


@dataclasses.dataclass
class ToolContext:
    """The part of agents.ToolContext this recipe relies on."""

    context: Any  # the run's context object: yours
    tool_call_id: str


def function_tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The part of agents.function_tool this recipe relies on: the model's arguments as
    keywords, after the ToolContext."""

    @functools.wraps(fn)
    def on_invoke(ctx: ToolContext, args: dict[str, Any]) -> Any:
        return fn(ctx, **args)

    return on_invoke


def openai_agents_recipe(create_ticket: Callable[..., dict[str, str]]) -> Callable[..., Any]:
    @function_tool
    def open_ticket(ctx: ToolContext, title: str, severity: str = "sev3") -> dict[str, str]:
        with idemkv.operation(f"{ctx.context['run_id']}:{ctx.tool_call_id}"):
            return create_ticket(title=title, severity=severity)

    return open_ticket


def main() -> None:
    endpoints = os.environ.get("IDEMKV_ENDPOINTS", "127.0.0.1:7420").split(",")
    client = idemkv.Client(endpoints, tenant="acme")
    create_ticket = make_create_ticket(client)
    run = os.urandom(4).hex()

    lg = langgraph_recipe(create_ticket)
    call = {"name": "open_ticket", "args": {"title": f"Outage {run}"}, "id": "call_1", "type": "tool_call"}
    config = {"configurable": {"thread_id": f"thread_{run}"}}
    first = lg.invoke(call, config)
    resumed = lg.invoke(call, config)  # LangGraph resuming the thread: same tool-call id
    print(f"langgraph: {first['id']} then, on resume, {resumed['id']} (tickets {len(TICKETS)})")

    oa = openai_agents_recipe(create_ticket)
    ctx = ToolContext(context={"run_id": f"run_{run}"}, tool_call_id="call_7")
    a = oa(ctx, {"title": f"Disk full {run}", "severity": "sev2"})
    b = oa(ctx, {"title": f"Disk full {run}", "severity": "sev2"})  # the turn retried
    c = oa(ToolContext(context={"run_id": f"run_{run}"}, tool_call_id="call_8"), {"title": f"Disk full {run}"})
    print(f"openai agents: {a['id']}, retried {b['id']}, a new tool call {c['id']} (tickets {len(TICKETS)})")
    print(f"tickets created: {len(TICKETS)} for 3 tool calls")


if __name__ == "__main__":
    main()

"""``@idempotent``: wrap a tool function, sync or async, in the tool-call loop.

    @idempotent(key=lambda args: f"{args['conversation']}:create_ticket",
                effect=lambda args: {"project": args["project"], "title": args["title"]},
                tool="create_ticket", side_effect="non_idempotent", probe=find_ticket)
    def create_ticket(args): ...

or, as a function, ``create_ticket = idempotent(create_ticket, key=..., ...)``.

key, effect and probe are called with the tool's own arguments. The wrapped function
returns what the tool returned, and on a replay (or when the probe found the effect)
the result stored with the receipt. Every error it raises is one of the six kinds of
:mod:`idemkv.errors`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from .errors import NotExecutedError
from .loop import Op, Outcome, Result, make_op
from .runner import run_async, run_sync

__all__ = ["idempotent", "set_default_client"]

F = TypeVar("F", bound=Callable[..., Any])

_default_client: Any = None


def set_default_client(client: Any) -> None:
    """The client of every ``@idempotent`` that names none."""
    global _default_client
    _default_client = client


def _bound_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    ba = inspect.signature(fn).bind(*args, **kwargs)
    ba.apply_defaults()
    out = dict(ba.arguments)
    out.pop("self", None)
    out.pop("cls", None)
    return out


def idempotent(
    fn: Optional[F] = None,
    *,
    key: Union[str, Callable[..., str]],
    tool: Optional[str] = None,
    effect: Optional[Callable[..., Any]] = None,
    side_effect: str = "non_idempotent",
    probe: Optional[Callable[..., Any]] = None,
    client: Any = None,
    tenant: Optional[str] = None,
    drop: Sequence[str] = (),
    actor: Optional[str] = None,
    ttl: Optional[float] = None,
    lease_ttl: Optional[float] = None,
    remote_system: Optional[str] = None,
    to_result: Optional[Callable[[Any], Result]] = None,
    deadline: Optional[float] = None,
    outcome: bool = False,
) -> Any:
    """Wrap fn so that, for one key, its effect happens at most once.

    key: the idempotency key, or a function of the tool's arguments that makes it.
    effect: a function of the tool's arguments giving the fields that define the
        effect (fingerprinted); default: all the arguments, by name.
    side_effect: "read_only", "idempotent" or "non_idempotent" (the default).
    probe: a function of the tool's arguments that looks the effect up downstream
        after an attempt died: the found value (or a Result), or None.
    client: a Client or AsyncClient; default: the one set_default_client gave.
    outcome: return the whole Outcome instead of the tool's value.
    """

    def wrap(f: F) -> F:
        name = tool or f.__name__

        def op_for(c: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Op:
            try:
                k = key(*args, **kwargs) if callable(key) else key
                e = effect(*args, **kwargs) if effect is not None else _bound_arguments(f, args, kwargs)
            except Exception as err:
                # The tool did not run: its key or effect could not be made.
                raise NotExecutedError(f"idemkv: the key or effect of {name} failed: {err!r}", cause=err) from err
            p = None if probe is None else functools.partial(probe, *args, **kwargs)
            opts: dict[str, Any] = dict(key=k, tool=name, side_effect=side_effect, probe=p, drop=drop, actor=actor,
                                        ttl=ttl, lease_ttl=lease_ttl, remote_system=remote_system,
                                        to_result=to_result, deadline=deadline)
            if side_effect != "read_only":
                opts["effect"] = e
            if tenant is not None:
                opts["tenant"] = tenant
            return make_op(c.config, **{k2: v for k2, v in opts.items() if v is not None or k2 == "probe"})

        def client_of() -> Any:
            c = client if client is not None else _default_client
            if c is None:
                raise ValueError("idemkv: @idempotent needs client= or idemkv.set_default_client(...)")
            return c

        def result(out: Outcome) -> Any:
            return out if outcome else out.value

        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                c = client_of().aio()
                out = await run_async(c, op_for(c, args, kwargs), functools.partial(f, *args, **kwargs))
                return result(out)

            return awrapper  # type: ignore[return-value]

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            c = client_of()
            if asyncio.iscoroutinefunction(getattr(c, "_send", None)):
                raise TypeError("idemkv: a sync tool needs a sync Client, not an AsyncClient")
            return result(run_sync(c, op_for(c, args, kwargs), functools.partial(f, *args, **kwargs)))

        return wrapper  # type: ignore[return-value]

    if fn is not None:
        return wrap(fn)
    return wrap

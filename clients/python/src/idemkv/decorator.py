"""``@idempotent``: wrap a tool function, sync or async, in the tool-call loop.

    @idempotent(key="order_id", tool="refund", probe=find_refund)
    def refund(order_id: str, amount_cents: int) -> Refund: ...

    @idempotent(tool="create_ticket")          # key from idemkv.operation(...)
    def create_ticket(title: str, severity: str = "sev3") -> Ticket: ...

or, as a function, ``create_ticket = idempotent(create_ticket, key=..., ...)``.

The key is, in this order: ``key=`` a function of the tool's arguments; ``key=`` the
name of one of its parameters (the key is ``"<that argument>:<tool>"``); ``key=`` a
fixed key (any string that is not a Python identifier); or, with no ``key=``, the
operation the call runs in (``with idemkv.operation("run_9:approval_17")``), giving
``"run_9:approval_17:<tool>"``.

The effect, unless ``effect=`` says otherwise, is the one default of every client
(docs/protocol.md, "One default effect"): a function of one parameter (no ``*args`` or
``**kwargs``; ``self``/``cls`` not counted) called with an object (a dict, a dataclass,
a pydantic model) has that object as its effect; any other call the object of its
arguments by name, as passed (defaults not filled in, ``**kwargs`` merged).

The wrapped function keeps fn's signature (``ParamSpec``) and returns what fn returned.
A replay, or a call whose probe found the effect, returns the stored result rebuilt by
``deserialize`` (default: the return annotation's dataclass or pydantic model, else the
JSON as stored); when no result was stored (an operator resolved the key with a receipt
only, or the result was too large to store) it returns ``from_receipt(receipt)``, by
default the receipt dict itself. Every error it raises is one of the six kinds of
:mod:`idemkv.errors`. Options are checked when the decorator is applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import typing
from typing import Any, Callable, Literal, Mapping, Optional, ParamSpec, Sequence, TypeVar, Union, overload

from ._context import current_operation, is_passthrough
from .errors import NotExecutedError
from .jcs import _MAX_DEPTH, FingerprintError, key_text
from .approval import ApprovalRequirement
from .loop import CLASSES, Op, Outcome, Result, make_op
from .runner import run_async, run_sync

__all__ = ["idempotent", "set_default_client", "default_effect"]

P = ParamSpec("P")
R = TypeVar("R")

_default_client: Any = None


def set_default_client(client: Any) -> None:
    """The client of every ``@idempotent`` that names none."""
    global _default_client
    _default_client = client


def _is_object(v: Any) -> bool:
    return isinstance(v, Mapping) or (dataclasses.is_dataclass(v) and not isinstance(v, type)) or hasattr(v, "model_dump")


def _as_json(v: Any) -> Any:
    """Dataclasses and pydantic models as their JSON objects, inside mappings, lists and
    tuples too; anything else as it is. It does not recurse: it refuses more than
    MAX_DEPTH mappings, lists and tuples inside one another, as the fingerprint does
    (each is an array or object of the effect), with a FingerprintError, whatever the
    caller's stack (a cycle is refused the same way)."""
    root: list[Any] = [None]
    # (value, where its JSON goes, at which key or index, how many containers hold it)
    work: list[tuple[Any, Any, Any, int]] = [(v, root, 0, 0)]
    while work:
        x, into, at, depth = work.pop()
        if isinstance(x, (Mapping, list, tuple)):
            if depth >= _MAX_DEPTH:
                raise FingerprintError(f"nesting too deep: more than {_MAX_DEPTH} arrays and objects inside one "
                                       "another")
            if isinstance(x, Mapping):
                d: dict[Any, Any] = {k: None for k in x}
                into[at] = d
                work.extend((y, d, k, depth + 1) for k, y in x.items())
            else:
                items: list[Any] = [None] * len(x)
                into[at] = items
                work.extend((y, items, i, depth + 1) for i, y in enumerate(x))
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            # dataclasses.asdict, without its recursion: a field that holds a model, a
            # mapping or a list is converted the same way.
            fields = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
            work.append((fields, into, at, depth))
        elif hasattr(x, "model_dump"):
            _refuse_sets(x)
            try:
                dumped = x.model_dump(mode="json")
            except Exception:
                into[at] = x  # not dumpable: the fingerprint refuses the model itself
            else:
                work.append((dumped, into, at, depth))
        else:
            into[at] = x
    return root[0]


def _refuse_sets(model: Any) -> None:
    """pydantic's JSON mode writes a set as a list in the set's iteration order, which
    string hashing changes from one process to the next: the same arguments would get
    another fingerprint in the next worker, and its retry a conflict. A set is refused,
    as it is in a dict or a dataclass."""
    try:
        value = model.model_dump(mode="python")
    except Exception:
        return  # not dumpable: the fingerprint refuses the model itself
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, (set, frozenset)):
            raise FingerprintError(f"{path or 'the argument'} is a set, which has no order: its fingerprint "
                                   "would differ between processes; use a list or a tuple")
        if isinstance(x, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), y) for k, y in x.items())
        elif isinstance(x, (list, tuple)):
            stack.extend((f"{path}[{i}]", y) for i, y in enumerate(x))


def default_effect(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The default effect of the call fn(*args, **kwargs), the same JSON the Go and
    TypeScript clients fingerprint for the same call (testdata/effect/vectors.json): a
    function of one parameter (``self``/``cls`` not counted, no ``*args`` or ``**kwargs``)
    called with an object → that object; otherwise the arguments by name as passed (no
    defaults filled in; ``self``/``cls`` left out; ``**kwargs`` merged in).

    Whether the object is unwrapped depends on the signature, not on how many arguments
    a call happens to pass: ``def update(record=None, id=None)`` called as
    ``update(record={"id": "42"})`` is ``{"record": {"id": "42"}}``, not the effect of
    ``update(id="42")``."""
    sig = inspect.signature(fn)
    ba = sig.bind(*args, **kwargs)
    named: dict[str, Any] = {}
    params = sig.parameters
    for name, value in ba.arguments.items():
        if name in ("self", "cls"):
            continue
        if params[name].kind is inspect.Parameter.VAR_KEYWORD:
            for k, x in value.items():
                if k in named:
                    # po(name, /, **fields) called as po("a", name="x"): one name, two
                    # values, and keeping either would alias two different calls.
                    raise FingerprintError(f"the argument {k!r} is given twice, by position and in **{name}")
                named[k] = x
        elif params[name].kind is inspect.Parameter.VAR_POSITIONAL:
            named[name] = list(value)
        else:
            named[name] = value
    if _takes_one_object(params) and len(named) == 1:
        (only,) = named.values()
        if _is_object(only):
            return _as_json(only)
    return _as_json(named)


def _takes_one_object(params: Mapping[str, inspect.Parameter]) -> bool:
    """The signature of a tool taking one object of arguments: exactly one parameter
    besides ``self``/``cls``, and no ``*args`` or ``**kwargs``. Only then is the object
    the effect; any other signature has the object of its named arguments, so that a
    call passing one object argument by name never shares an effect with a call passing
    that object's members as arguments."""
    rest = [p for name, p in params.items() if name not in ("self", "cls")]
    return len(rest) == 1 and rest[0].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _exceptions(name: str, v: Any) -> tuple[type[BaseException], ...]:
    t = v if isinstance(v, tuple) else (v,)
    for c in t:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise TypeError(f"idemkv: {name} takes exception classes, not {c!r}")
    return t


def _check_hook(name: str, hook: Any, fn: Callable[..., Any], tool: str) -> None:
    """A key, effect or probe function is called with the tool's own arguments: it must
    take them, positionally or by name, or every call would fail."""
    if hook is None:
        return
    if not callable(hook):
        raise TypeError(f"idemkv: {name}= of {tool} must be callable, not {type(hook).__name__}")
    try:
        sig, hsig = inspect.signature(fn), inspect.signature(hook)
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check
    # self and cls included: a method's hooks are called with them too.
    params = list(sig.parameters.values())
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: None for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    forms = [[None] * len(required), [None] * len(positional)]
    for form in forms:
        try:
            hsig.bind(*form)
            return
        except TypeError:
            pass
    try:
        hsig.bind(**by_name)
        return
    except TypeError:
        pass
    raise TypeError(f"idemkv: {name}= of {tool} takes {hsig}, which cannot take the arguments of {tool}{sig}")


def _rebuilder(f: Callable[..., Any]) -> Callable[[Any], Any]:
    """The stored JSON back as f's declared return type, where that is a dataclass or a
    pydantic model; anything else comes back as stored."""
    try:
        ret = typing.get_type_hints(f).get("return")
    except Exception:  # forward references that do not resolve: no rebuild
        return lambda v: v
    if isinstance(ret, type) and dataclasses.is_dataclass(ret):
        cls = ret
        return lambda v: cls(**v) if isinstance(v, Mapping) else v
    if isinstance(ret, type) and hasattr(ret, "model_validate"):
        return ret.model_validate  # type: ignore[no-any-return]
    return lambda v: v


@overload
def idempotent(
    fn: Callable[P, R], *, key: Union[str, Callable[..., str], None] = ..., tool: Optional[str] = ...,
    effect: Optional[Callable[..., Any]] = ..., side_effect: str = ..., probe: Optional[Callable[..., Any]] = ...,
    client: Any = ..., tenant: Optional[str] = ..., drop: Sequence[str] = ..., actor: Optional[str] = ...,
    ttl: Optional[float] = ..., lease_ttl: Optional[float] = ..., remote_system: Optional[str] = ...,
    to_result: Optional[Callable[[Any], Result]] = ..., deadline: Optional[float] = ...,
    outcome: Literal[False] = ..., not_executed_on: Any = ..., permanent_on: Any = ...,
    serialize: Optional[Callable[[Any], Any]] = ..., deserialize: Optional[Callable[[Any], Any]] = ...,
    from_receipt: Optional[Callable[[dict[str, Any]], Any]] = ..., approval: Optional[ApprovalRequirement] = ...,
) -> Callable[P, R]: ...


@overload
def idempotent(
    fn: None = None, *, key: Union[str, Callable[..., str], None] = ..., tool: Optional[str] = ...,
    effect: Optional[Callable[..., Any]] = ..., side_effect: str = ..., probe: Optional[Callable[..., Any]] = ...,
    client: Any = ..., tenant: Optional[str] = ..., drop: Sequence[str] = ..., actor: Optional[str] = ...,
    ttl: Optional[float] = ..., lease_ttl: Optional[float] = ..., remote_system: Optional[str] = ...,
    to_result: Optional[Callable[[Any], Result]] = ..., deadline: Optional[float] = ...,
    outcome: Literal[False] = ..., not_executed_on: Any = ..., permanent_on: Any = ...,
    serialize: Optional[Callable[[Any], Any]] = ..., deserialize: Optional[Callable[[Any], Any]] = ...,
    from_receipt: Optional[Callable[[dict[str, Any]], Any]] = ..., approval: Optional[ApprovalRequirement] = ...,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


@overload
def idempotent(
    fn: Callable[P, Any], *, key: Union[str, Callable[..., str], None] = ..., tool: Optional[str] = ...,
    effect: Optional[Callable[..., Any]] = ..., side_effect: str = ..., probe: Optional[Callable[..., Any]] = ...,
    client: Any = ..., tenant: Optional[str] = ..., drop: Sequence[str] = ..., actor: Optional[str] = ...,
    ttl: Optional[float] = ..., lease_ttl: Optional[float] = ..., remote_system: Optional[str] = ...,
    to_result: Optional[Callable[[Any], Result]] = ..., deadline: Optional[float] = ...,
    outcome: Literal[True], not_executed_on: Any = ..., permanent_on: Any = ...,
    serialize: Optional[Callable[[Any], Any]] = ..., deserialize: Optional[Callable[[Any], Any]] = ...,
    from_receipt: Optional[Callable[[dict[str, Any]], Any]] = ..., approval: Optional[ApprovalRequirement] = ...,
) -> Callable[P, Any]: ...


@overload
def idempotent(
    fn: None = None, *, key: Union[str, Callable[..., str], None] = ..., tool: Optional[str] = ...,
    effect: Optional[Callable[..., Any]] = ..., side_effect: str = ..., probe: Optional[Callable[..., Any]] = ...,
    client: Any = ..., tenant: Optional[str] = ..., drop: Sequence[str] = ..., actor: Optional[str] = ...,
    ttl: Optional[float] = ..., lease_ttl: Optional[float] = ..., remote_system: Optional[str] = ...,
    to_result: Optional[Callable[[Any], Result]] = ..., deadline: Optional[float] = ...,
    outcome: Literal[True], not_executed_on: Any = ..., permanent_on: Any = ...,
    serialize: Optional[Callable[[Any], Any]] = ..., deserialize: Optional[Callable[[Any], Any]] = ...,
    from_receipt: Optional[Callable[[dict[str, Any]], Any]] = ..., approval: Optional[ApprovalRequirement] = ...,
) -> Callable[[Callable[P, Any]], Callable[P, Any]]: ...


def idempotent(
    fn: Optional[Callable[..., Any]] = None,
    *,
    key: Union[str, Callable[..., str], None] = None,
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
    not_executed_on: Any = (),
    permanent_on: Any = (),
    serialize: Optional[Callable[[Any], Any]] = None,
    deserialize: Optional[Callable[[Any], Any]] = None,
    from_receipt: Optional[Callable[[dict[str, Any]], Any]] = None,
    approval: Optional[ApprovalRequirement] = None,
) -> Any:
    """Wrap fn so that, for one key, its effect happens at most once.

    key: a function of the tool's arguments, the name of the parameter that holds
        the key's business id, or a fixed key; default: the current idemkv.operation.
    effect: a function of the tool's arguments giving the fields that define the
        effect (fingerprinted); default: see default_effect.
    side_effect: "read_only", "idempotent" or "non_idempotent" (the default).
    probe: a function of the tool's arguments that looks the effect up downstream
        after an attempt died: the found value (or a Result), or None.
    not_executed_on / permanent_on: exception classes of the tool meaning "certainly
        not executed" (the key is released) and "failed for good" (stored, replayed).
    serialize / deserialize: the tool's value as the stored JSON, and back (replays).
    from_receipt: what a replay returns when no result was stored; default the receipt.
    approval: an ApprovalRequirement: a person approves the effect before it runs; its
        summary may be a function of the tool's arguments. The call waits for the
        decision up to its wait, or raises ApprovalPendingError; a denial is an
        ApprovalDeniedError, replayed to every retry.
    client: a Client or AsyncClient; default: the one set_default_client gave.
    outcome: return the whole Outcome instead of the tool's value.
    """
    if side_effect not in CLASSES:
        raise ValueError(f"idemkv: unknown side_effect {side_effect!r}; one of {sorted(CLASSES)}")
    if tool is not None and (not isinstance(tool, str) or not tool):
        raise TypeError("idemkv: tool= must be a non-empty string")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise TypeError("idemkv: tenant= must be a non-empty string")
    if isinstance(drop, str) or not all(isinstance(d, str) for d in drop):
        raise TypeError("idemkv: drop= is a list of field paths, e.g. drop=['trace_id']")
    # The server's bounds: a TTL of at least a minute, a lease of at least a second.
    for name, v, least in (("ttl", ttl, 60.0), ("lease_ttl", lease_ttl, 1.0), ("deadline", deadline, 1e-9)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < least):
            raise ValueError(f"idemkv: {name}= must be a number of seconds, at least {least:g}")
    for name, hook in (("to_result", to_result), ("serialize", serialize), ("deserialize", deserialize),
                       ("from_receipt", from_receipt)):
        if hook is not None and not callable(hook):
            raise TypeError(f"idemkv: {name}= must be callable")
    if key is not None and not isinstance(key, str) and not callable(key):
        raise TypeError("idemkv: key= is a function of the tool's arguments, a parameter name or a fixed key")
    ne_on, perm_on = _exceptions("not_executed_on", not_executed_on), _exceptions("permanent_on", permanent_on)
    if side_effect == "read_only" and (probe is not None or effect is not None):
        raise ValueError("idemkv: a read_only tool takes no probe= or effect= (nothing is reserved)")
    if approval is not None and not isinstance(approval, ApprovalRequirement):
        raise TypeError(f"idemkv: approval= takes an idemkv.ApprovalRequirement, not {type(approval).__name__}")
    if approval is not None and side_effect == "read_only":
        raise ValueError("idemkv: a read_only tool takes no approval= (nothing is reserved)")

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TypeError("idemkv: @idempotent wraps a function")
        name = tool or f.__name__
        sig = inspect.signature(f)
        key_param: Optional[str] = None
        if isinstance(key, str) and key.isidentifier():
            if key not in sig.parameters:
                raise TypeError(f"idemkv: key={key!r} names no parameter of {name}{sig}; "
                                f"for a fixed key use one that is not a Python identifier, or key=lambda ...")
            key_param = key
        summary = approval.summary if approval is not None and callable(approval.summary) else None
        for hook_name, hook in (("key", key if callable(key) else None), ("effect", effect), ("probe", probe),
                                ("approval summary", summary)):
            _check_hook(hook_name, hook, f, name)
        rebuild = deserialize or _rebuilder(f)

        def key_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            if callable(key):
                return key(*args, **kwargs)
            if key_param is not None:
                v = sig.bind_partial(*args, **kwargs).arguments.get(key_param)
                if v is None or v == "":
                    raise ValueError(f"the argument {key_param!r} that names the key is missing or empty")
                return f"{key_text(v)}:{name}"
            if isinstance(key, str):
                return key
            opn = current_operation()
            if opn is None:
                raise ValueError(f"{name} has no key: give key= or call it inside idemkv.operation(...)")
            return f"{opn.id}:{name}"

        def op_for(c: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Op:
            try:
                k = key_for(args, kwargs)
                e = None
                if side_effect != "read_only":
                    e = effect(*args, **kwargs) if effect is not None else default_effect(f, args, kwargs)
                a = approval
                if summary is not None:
                    text = summary(*args, **kwargs)
                    if not isinstance(text, str):
                        raise TypeError(f"the approval summary function returned {type(text).__name__}, not text")
                    a = dataclasses.replace(approval, summary=text)
            except Exception as err:
                # The tool did not run: its key, effect or summary could not be made.
                raise NotExecutedError(f"idemkv: the key, effect or approval summary of {name} failed: {err!r}",
                                       cause=err) from err
            p = None if probe is None else functools.partial(probe, *args, **kwargs)
            opn = current_operation()
            opts: dict[str, Any] = dict(key=k, tool=name, side_effect=side_effect, probe=p, drop=drop, actor=actor,
                                        ttl=ttl, lease_ttl=lease_ttl, remote_system=remote_system,
                                        to_result=to_result, deadline=deadline, not_executed_on=ne_on,
                                        permanent_on=perm_on, serialize=serialize, approval=a,
                                        attempt_id=opn.attempt_id if opn is not None else None)
            if side_effect != "read_only":
                opts["effect"] = e
            if tenant is not None:
                opts["tenant"] = tenant
            return make_op(c.config, **{k2: v for k2, v in opts.items() if v is not None or k2 == "probe"})

        def client_of() -> Any:
            c = client if client is not None else _default_client
            if c is None:
                raise NotExecutedError(f"idemkv: {name} needs client= or idemkv.set_default_client(...)")
            return c

        def result(out: Outcome) -> Any:
            if outcome:
                return out
            if not (out.replayed or out.probed):
                return out.value  # the tool ran in this call: its own value
            stored = out.receipt.get("result")
            if stored is None or out.result_omitted:
                return from_receipt(dict(out.receipt)) if from_receipt is not None else dict(out.receipt)
            return rebuild(stored)

        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                if is_passthrough():
                    return await f(*args, **kwargs)
                c = client_of().aio()
                out = await run_async(c, op_for(c, args, kwargs), functools.partial(f, *args, **kwargs))
                return result(out)

            return awrapper

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if is_passthrough():
                return f(*args, **kwargs)
            c = client_of()
            if asyncio.iscoroutinefunction(getattr(c, "_send", None)):
                raise TypeError("idemkv: a sync tool needs a sync Client, not an AsyncClient")
            return result(run_sync(c, op_for(c, args, kwargs), functools.partial(f, *args, **kwargs)))

        return wrapper

    if fn is not None:
        return wrap(fn)
    return wrap


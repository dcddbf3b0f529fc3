"""Checked by mypy --strict (python_test.go), never run: the decorators keep the wrapped
tool's signature and return type, so a wrong call is a type error, not a NotExecutedError
at run time (issue 24, point 8). Under --strict an unused "type: ignore" is an error, so
each ignore below proves mypy saw the mistake it covers."""

from dataclasses import dataclass
from typing import Any

import idemkv


@dataclass
class Refund:
    id: str
    amount_cents: int


@idemkv.idempotent(tool="refund", key="order_id", side_effect="non_idempotent_mutation")
def refund(order_id: str, amount_cents: int, note: str = "") -> Refund:
    return Refund("re_1", amount_cents)


def plain(title: str) -> str:
    return title


wrapped = idemkv.idempotent(plain, key="title")

r: Refund = refund("order-1", 500)
r2: Refund = refund("order-1", amount_cents=500, note="x")
s: str = wrapped("t")

refund("order-1")  # type: ignore[call-arg]
refund("order-1", "500")  # type: ignore[arg-type]
bad: int = refund("order-1", 500)  # type: ignore[assignment]
wrapped(1)  # type: ignore[arg-type]


@idemkv.idempotent(tool="refund", key="order_id", outcome=True)
def refund_outcome(order_id: str) -> Refund:
    return Refund("re_2", 1)


o: Any = refund_outcome("order-2")
refund_outcome(2)  # type: ignore[arg-type]

"""Kubernetes resource quantities (`resource.Quantity`), as the API server writes them back.

The server stores a quantity in canonical form: a pod asking `volcano.sh/vgpu-memory: "3000"` is
read back as `3k`, and 81920 stays `81920`. Every reader of limits or allocatable must therefore
parse suffixes, not `int()` the text.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_FORM = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(value: Any) -> int:
    """The integer value of a quantity, rounded up as `Quantity.Value()` does ("3k" -> 3000,
    "1Ki" -> 1024, "500m" -> 1). ValueError names the text when it is not a quantity."""
    text = str(value).strip()
    found = _FORM.match(text)
    if not found:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = found.group(1), found.group(2) or ""
    try:
        amount = Decimal(number)
        if suffix in _BINARY:
            amount *= _BINARY[suffix]
        elif suffix[:1] in ("e", "E") and len(suffix) > 1:
            amount *= Decimal(10) ** int(suffix[1:])
        else:
            amount *= _DECIMAL[suffix]
        return math.ceil(amount)
    except (ArithmeticError, KeyError) as exc:  # InvalidOperation, Overflow ("1e999999999")
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from exc


def quantity_or_zero(value: Any) -> int:
    """`parse_quantity`, with 0 for a missing or malformed value (reports that must not fail)."""
    try:
        return parse_quantity(value)
    except ValueError:
        return 0

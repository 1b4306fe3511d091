"""What a function body may return, checked the same way at inference and on devices."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .errors import KernelOutputError

#: dtype kinds a block may have: bool, signed and unsigned int, float, complex
NUMERIC_KINDS = "biufc"


def as_block(value: Any, function: str, index: int) -> np.ndarray:
    """``value`` as a block of output ``index`` of ``function``, or a typed error saying what came.

    NumPy arrays and scalars and Python numbers are blocks; lists, strings and
    other objects are not (``np.asarray`` would quietly turn them into arrays).
    """
    if isinstance(value, (np.ndarray, np.generic)) or (
            isinstance(value, numbers.Number) and not isinstance(value, (str, bytes))):
        block = np.asarray(value)
        if block.dtype.kind in NUMERIC_KINDS:
            return block
        what = f"an array of dtype {block.dtype}"
    else:
        what = f"a {type(value).__name__} ({_short(value)})"
    raise KernelOutputError(
        f"Function {function!r} output {index} must be a numeric NumPy array or scalar, but the "
        f"body returned {what}. Return np.asarray(...) of numbers; pass other values through closures"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

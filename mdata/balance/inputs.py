"""Input checks shared by the balancer, the per-rank baseline and the CP split.

Why: the search code runs on plain lists for speed and trusts its inputs; every entry point
checks them here first, so a bad plan (a sample longer than the context, a negative or NaN cost)
fails with a :class:`~mdata.errors.PlanError` that says what to fix instead of a wrong assignment.
"""

from __future__ import annotations

import numpy as np

from mdata.errors import PlanError

__all__ = ["positive_int", "validate_step"]


def positive_int(name: str, value: object) -> int:
    """``value`` as an int, or a :class:`PlanError` naming ``name`` unless it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PlanError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def validate_step(
    num_tokens, costs, dp, micro_batches, max_tokens, pad_multiple
) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Checked inputs; the returned token counts are *slots*: rounded up to ``pad_multiple``."""
    dp = positive_int("dp", dp)
    micro_batches = positive_int("micro_batches", micro_batches)
    max_tokens = positive_int("max_tokens", max_tokens)
    pad_multiple = positive_int("pad_multiple", pad_multiple)
    tokens = np.asarray(num_tokens)
    cost = np.asarray(costs, dtype=np.float64)
    if tokens.ndim != 1 or cost.shape != tokens.shape:
        raise PlanError(
            f"num_tokens and costs must be 1-d arrays of the same length, got shapes "
            f"{tokens.shape} and {cost.shape}"
        )
    if tokens.size and tokens.dtype.kind not in "iu":
        raise PlanError(f"num_tokens must be integers, got dtype {tokens.dtype}")
    tokens = tokens.astype(np.int64)
    if tokens.size:
        slots = -(-tokens // pad_multiple) * pad_multiple
        bad = np.flatnonzero((tokens < 0) | (slots > max_tokens))
        if bad.size:
            i = int(bad[0])
            padded = "" if pad_multiple == 1 else (
                f" ({slots[i]} after padding to a multiple of {pad_multiple}; make max_tokens a "
                f"multiple of {pad_multiple})"
            )
            raise PlanError(
                f"sample {i} has {tokens[i]} tokens{padded}, outside 0..max_tokens={max_tokens}; "
                f"truncate samples to max_tokens before balancing"
            )
        tokens = slots
        bad = np.flatnonzero(~np.isfinite(cost) | (cost < 0))
        if bad.size:
            i = int(bad[0])
            raise PlanError(
                f"sample {i} has cost {float(cost[i])}; costs must be finite and >= 0 "
                f"(check the plan's cost model)"
            )
    return tokens, cost, dp, micro_batches, max_tokens

"""Learning-rate schedule: linear warmup, then cosine decay to 0 (as a LambdaLR multiplier).

A run fitted to a time limit (`schedule.fit_to_time`) may change its step count while it runs (`refit_total`).
The cosine then keeps the progress it has reached and spreads the rest over the new count, so the learning rate
never jumps: it only decays a little faster or slower from there on. Each re-fit is a (step, new total) pair,
kept in the run's checkpoints so that a resumed run continues the same curve.
"""

from __future__ import annotations

import math

REFIT_AT = (0.2, 0.4, 0.6, 0.8, 0.9)
"""Shares of the planned steps at which a time-fitted run re-measures its step time and re-fits its length. The
last is late enough that the few steps after it cannot drift far, early enough to leave them a cosine tail."""
REFIT_TARGET = 0.97
"""Share of the time limit the re-fitted steps aim to fill: the hard limit stays a margin away, for the step-time
noise of the steps after the last re-fit (a 20-step window varies about 8% on a shared 2-core VM)."""


def effective_warmup(warmup_steps: int, total_steps: int) -> int:
    """Warmup capped at a tenth of the run, at least 1 step (the original's rule)."""
    return max(1, min(warmup_steps, total_steps // 10)) if warmup_steps else 0


def cosine_progress(step: int, *, warmup: int, total: int, refits: list | tuple = ()) -> float:
    """How far along the cosine optimizer step `step` (0-based, >= warmup) is, in [0, 1].

    Without re-fits: (step - warmup) / (total - warmup). A re-fit (at, new_total) keeps the progress reached at
    step `at` and spreads what is left of it evenly over steps at..new_total.
    """
    start, done, end = warmup, 0.0, total
    for at, new_total in refits:
        if step < at:
            break
        done += min(1.0, (at - start) / max(1, end - start)) * (1.0 - done)
        start, end = at, new_total
    return min(1.0, done + (step - start) / max(1, end - start) * (1.0 - done))


def lr_multiplier(step: int, *, warmup: int, total: int, refits: list | tuple = ()) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based): (s+1)/W during warmup, then cosine."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * cosine_progress(step, warmup=warmup, total=total, refits=refits)))


def make_scheduler(optimizer, *, warmup: int, total: int, refits: list | None = None):
    """A LambdaLR over `lr_multiplier`. `refits`: a list the caller appends (step, new_total) pairs to; the
    scheduler reads it at every step (it is held by reference, outside the scheduler's own state dict)."""
    from functools import partial

    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, partial(lr_multiplier, warmup=warmup, total=total,
                                       refits=refits if refits is not None else []))


def refit_total(*, step: int, elapsed_s: float, step_s: float, max_time_s: float, ceiling: int) -> int:
    """The step count that ends at REFIT_TARGET of `max_time_s`, `step` steps and `elapsed_s` seconds in, at
    `step_s` seconds a step from here; at least one more step, at most `ceiling`."""
    left = REFIT_TARGET * max_time_s - elapsed_s
    return max(step + 1, min(ceiling, step + int(left // step_s) if step_s > 0 else ceiling))

"""Learning-rate schedule: linear warmup, then cosine decay to 0 (as a LambdaLR multiplier)."""

from __future__ import annotations

import math


def effective_warmup(warmup_steps: int, total_steps: int) -> int:
    """Warmup capped at a tenth of the run, at least 1 step (the original's rule)."""
    return max(1, min(warmup_steps, total_steps // 10)) if warmup_steps else 0


def lr_multiplier(step: int, *, warmup: int, total: int) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based): (s+1)/W during warmup, then cosine."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer, *, warmup: int, total: int):
    from functools import partial

    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, partial(lr_multiplier, warmup=warmup, total=total))

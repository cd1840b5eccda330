"""Micro-batch size from measured memory: on a GPU, as few forward/backward passes per step as memory allows.

A step trains batch_size x grad_accum rows (per process) in grad_accum passes of batch_size rows. On a GPU a small
pass leaves the device waiting on Python: Qwen2.5-0.5B at 2 rows of 2,048 tokens kept an H100 busy about a third of
each step (torch.profiler), and the same rows in one pass of 8 trained 3.4x faster
(bench/results/gpu_profile-h100.json). The 16 GB preset's 1-row, 384-token passes are smaller still.

`micro_batch: auto` therefore merges a step's passes, keeping its rows, its loss (summed over the same supervised
tokens, divided once) and its update; only the order of the float sums changes. The size comes from a measurement,
not the rough estimate `mens probe` prints: before training, one backward pass of the longest row, whose peak
allocation above what was already held is that row's activation cost (with gradient checkpointing as already
decided: merging never turns it on). The step's rows are sorted by length before they are split, so a merged pass
pads little. CPU passes gain little from merging and keep the configured size, as do runs of several processes.
"""

from __future__ import annotations

FIT_SHARE = 0.85
"""Share of the process's GPU memory a merged pass may plan to use (the rest: fragmentation, the CUDA context and
kernels' workspaces outside the allocator)."""


def choose_micro_batch(configured: int, step_rows: int, *, row_bytes: int, budget_bytes: int) -> int:
    """Rows per pass: the largest divisor of `step_rows` whose activations (`row_bytes` each) fit `budget_bytes`,
    never fewer than `configured` (the user's setting stands when even it does not fit)."""
    best = configured
    for n in range(configured + 1, step_rows + 1):
        if step_rows % n == 0 and n * row_bytes <= budget_bytes:
            best = n
    return best


def measure_row(model, row, *, pad_id: int, device: str, autocast) -> dict:
    """One forward and backward of `row` on a CUDA device: bytes held before it, its peak above that, and the
    trainable parameters' gradient and AdamW-state bytes (held for the whole run once training starts). The
    gradients are dropped afterwards; call before the dropout stream is seeded (this pass draws from it)."""
    import torch

    from mens.train.packing import batch_loss_sum

    trainable = [p for p in model.parameters() if p.requires_grad]
    param_bytes = sum(p.numel() * p.element_size() for p in trainable)
    was_training = model.training
    model.train()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        total, _ = batch_loss_sum(model, [row], pad_id, device, autocast)
        total.backward()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return {"base": base, "row": max(1, peak - base - param_bytes), "grads": param_bytes, "optimizer": 2 * param_bytes}


def fit_micro_batch(setting: str, *, model, rows: list, batch_size: int, grad_accum: int, world: int, device: str,
                    memory_gb: float | None, pad_id: int, autocast) -> tuple[int, str]:
    """(rows per pass, why) for this run: `batch_size` unless `setting` is "auto" on one CUDA process with room."""
    step_rows = batch_size * grad_accum
    if setting != "auto":
        return batch_size, f"{batch_size} rows x {grad_accum} passes (micro_batch: {setting})"
    if not device.startswith("cuda") or world > 1 or grad_accum == 1 or not rows:
        where = "several processes" if world > 1 else "one pass per step already" if grad_accum == 1 else device
        return batch_size, f"{batch_size} rows x {grad_accum} passes (as set: {where})"
    import torch

    from mens.train.packing import row_tokens

    longest = max(rows, key=row_tokens)
    m = measure_row(model, longest, pad_id=pad_id, device=device, autocast=autocast)
    free, _ = torch.cuda.mem_get_info(device)
    usable = min(FIT_SHARE * (memory_gb or 0) * 2**30, free + torch.cuda.memory_reserved(device))
    budget = int(usable - m["base"] - m["grads"] - m["optimizer"])
    n = choose_micro_batch(batch_size, step_rows, row_bytes=m["row"], budget_bytes=budget)
    measured = (f"a {row_tokens(longest):,}-token row measured {m['row'] / 2**30:.2f} GB of activations; "
                f"{max(0, budget) / 2**30:.1f} GB free for them")
    if n == batch_size:
        return batch_size, f"{batch_size} rows x {grad_accum} passes (no larger split fits: {measured})"
    return n, f"{n} rows x {step_rows // n} passes (merged from {batch_size} x {grad_accum}: {measured})"


def step_passes(rows: list, size: int, *, merged: bool) -> list[list]:
    """A step's rows in passes of `size`; merged passes take the rows longest first so each pass pads little."""
    from mens.train.packing import row_tokens

    if merged:
        rows = sorted(rows, key=row_tokens, reverse=True)
    return [rows[i:i + size] for i in range(0, len(rows), size)]

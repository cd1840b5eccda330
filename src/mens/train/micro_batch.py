"""Micro-batch size from measured memory: on a GPU, as few forward/backward passes per step as memory allows.

A step trains batch_size x grad_accum rows (per process) in grad_accum passes of batch_size rows. On a GPU a small
pass leaves the device waiting on Python: for Qwen2.5-0.5B in passes of 2 rows of 2,048 tokens, an H100's kernels
take about 0.75 s of a 1.1-1.6 s step (torch.profiler, bench/results/gpu_profile-h100.json), and mens trained the
same rows in one pass of 8 at 2.1x (LoRA) and 3.5x (QLoRA) the tokens/s (gpu_train_speed-h100.json against
gpu_train_speed-bs8-h100.json). The 16 GB preset's 1-row, 384-token passes are smaller still.

`micro_batch: auto` therefore merges a step's passes, keeping its rows, its loss (summed over the same supervised
tokens, divided once) and its update; only the order of the float sums changes. The size comes from measurements,
not the rough estimate `mens probe` prints: before training, backward passes of the longest row and of the two
longest, whose peak allocations above what was already held give a pass's fixed and per-row cost (with gradient
checkpointing as already decided: merging never turns it on). The step's rows are sorted by length before they
are split, so a merged pass pads little. CPU passes gain little from merging and keep the configured size, as do
runs of several processes.
"""

from __future__ import annotations

from mens.train.packing import batch_loss_sum, row_tokens

FIT_SHARE = 0.85
"""Share of the process's GPU memory a merged pass may plan to use (the rest: fragmentation, the CUDA context and
kernels' workspaces outside the allocator)."""


def choose_micro_batch(configured: int, step_rows: int, *, row_bytes: int, fixed_bytes: int = 0,
                       budget_bytes: int) -> int:
    """Rows per pass: the largest divisor of `step_rows` whose activations (`fixed_bytes` + `row_bytes` per row)
    fit `budget_bytes`, never fewer than `configured` (the user's setting stands when even it does not fit)."""
    best = configured
    for n in range(configured + 1, step_rows + 1):
        if step_rows % n == 0 and fixed_bytes + n * row_bytes <= budget_bytes:
            best = n
    return best


def measure_pass(model, rows: list, *, pad_id: int, device: str, autocast) -> dict:
    """One forward and backward of `rows` on a CUDA device: bytes held before it, its peak above that less the
    trainable parameters' gradients (`pass`), and those gradients' and AdamW's state bytes (held for the whole run
    once training starts). The gradients are dropped afterwards; call before the dropout stream is seeded (this
    pass draws from it)."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    param_bytes = sum(p.numel() * p.element_size() for p in trainable)
    was_training = model.training
    model.train()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        total, _ = batch_loss_sum(model, rows, pad_id, device, autocast)
        total.backward()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return {"base": base, "pass": max(1, peak - base - param_bytes), "grads": param_bytes,
            "optimizer": 2 * param_bytes}


def fit_micro_batch(setting: str, *, model, rows: list, batch_size: int, grad_accum: int, world: int, device: str,
                    memory_gb: float | None, pad_id: int, autocast) -> tuple[int, str]:
    """(rows per pass, why) for this run: `batch_size` unless `setting` is "auto" on one CUDA process with room.

    Two measured passes, of the longest row and of the two longest, split a pass's cost into what any pass holds
    (the loss chunk, dequantized weights, workspaces) and what each row adds; the per-row share is taken as at
    least a quarter of the one-row pass, a floor against a slope hidden by the allocator's rounding."""
    step_rows = batch_size * grad_accum
    if setting != "auto":
        return batch_size, f"{batch_size} rows x {grad_accum} passes (micro_batch: {setting})"
    if not device.startswith("cuda") or world > 1 or grad_accum == 1 or not rows:
        where = "several processes" if world > 1 else "one pass per step already" if grad_accum == 1 else device
        return batch_size, f"{batch_size} rows x {grad_accum} passes (as set: {where})"
    import torch

    longest = sorted(rows, key=row_tokens, reverse=True)[:2]
    one = measure_pass(model, longest[:1], pad_id=pad_id, device=device, autocast=autocast)
    free, _ = torch.cuda.mem_get_info(device)
    usable = min(FIT_SHARE * (memory_gb or 0) * 2**30, free + torch.cuda.memory_reserved(device))
    budget = int(usable - one["base"] - one["grads"] - one["optimizer"])
    per_row, fixed, two = one["pass"], 0, None
    if len(longest) == 2 and budget >= one["pass"]:
        try:
            two = measure_pass(model, longest, pad_id=pad_id, device=device, autocast=autocast)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
        if two is not None:
            per_row = max(two["pass"] - one["pass"], one["pass"] // 4)
            fixed = max(0, one["pass"] - per_row)
    n = choose_micro_batch(batch_size, step_rows, row_bytes=per_row, fixed_bytes=fixed, budget_bytes=budget)
    gb = 2**30
    measured = (f"a {row_tokens(longest[0]):,}-token row measured {one['pass'] / gb:.2f} GB"
                + (f", two {two['pass'] / gb:.2f} GB ({fixed / gb:.2f} GB per pass + {per_row / gb:.2f} GB per row)"
                   if two else "") + f"; {max(0, budget) / gb:.1f} GB free for activations")
    if n == batch_size:
        return batch_size, f"{batch_size} rows x {grad_accum} passes (no larger split fits: {measured})"
    return n, f"{n} rows x {step_rows // n} passes (merged from {batch_size} x {grad_accum}: {measured})"


def step_passes(rows: list, size: int, *, merged: bool) -> list[list]:
    """A step's rows in passes of `size`; merged passes take the rows longest first so each pass pads little."""
    if merged:
        rows = sorted(rows, key=row_tokens, reverse=True)
    return [rows[i:i + size] for i in range(0, len(rows), size)]

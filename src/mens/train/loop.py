"""The training loop, written out: for each optimizer step, accumulate token-weighted gradients over the
micro-batches of this rank's share of the global batch, sum them over ranks, clip, step, log, evaluate, save.

Loss of a step = (sum of per-token CE over all supervised tokens of the global batch) / (their count), so
batch 8 x accum 1, batch 2 x accum 4 and 2 processes x batch 4 give the same update. With FSDP (`d.sharded`)
FSDP sums the gradients during backward, and every rank runs as many passes as rank 0 (the largest share) so
that its collectives line up: a rank with fewer rows adds zero-weighted passes.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mens.errors import ModelError
from mens.train import distributed, fsdp
from mens.train.checkpoint import save_checkpoint
from mens.train.data import BatchPlan, hardest_first
from mens.train.micro_batch import step_passes
from mens.train.packing import Row, batch_loss_sum, row_supervised, row_tokens
from mens.train.progress import ProgressView
from mens.train.schedule import REFIT_AT, refit_total
from mens.train.telemetry import Telemetry

_PAUSE_AFTER_STEP = int(os.environ.get("MENS_TRAIN_PAUSE_AFTER_STEP", "0"))


@dataclass
class LoopState:
    """What the loop reports back (and what a checkpoint's state.json records)."""

    step: int = 0
    last_loss: float = float("nan")
    last_val_loss: float | None = None
    losses: list[float] = field(default_factory=list)
    input_tokens: int = 0
    supervised_tokens: int = 0
    train_seconds: float = 0.0
    stopped_early: bool = False
    """The time limit (schedule.max_time_s) ended the run before its planned last step."""


def accumulate_gradients(model, micro: list[list[Row]], n_supervised: float, *, pad_id: int, device: str,
                         autocast, passes: int = 0, filler: list[Row] | None = None) -> float:
    """Backward every micro-batch with loss = (its token-loss sum) / (supervised tokens of the whole global batch).

    Returns this rank's token-loss sum. Every supervised token of the step weighs the same, however the global
    batch is split into micro-batches or processes. `passes` > len(micro): backward `filler` that many extra times
    with weight 0 (FSDP: this rank still joins every collective, and its gradient is unchanged).
    """
    # Summed on the device and read once per step: an .item() per micro-batch would stall a GPU's queue each time.
    parts = []
    for mb in micro:
        part, _ = batch_loss_sum(model, mb, pad_id, device, autocast)
        (part / n_supervised).backward()
        parts.append(part.detach())
    for _ in range(passes - len(micro)):
        part, _ = batch_loss_sum(model, filler, pad_id, device, autocast)
        (part * 0.0).backward()
    return float(torch.stack(parts).cpu().double().sum()) if parts else 0.0  # one sync; f64 as before


def lockstep_passes(d, n_rows: int, batch_size: int) -> int:
    """Micro-batches every rank must run when sharded: those of rank 0, whose share rows[0::world] is the largest."""
    return math.ceil(math.ceil(n_rows / d.world) / batch_size) if d.sharded else 0


def clip_gradients(params: list, max_norm: float) -> float:
    """Global L2 norm of the gradients, clipped to max_norm when > 0 (FSDP's DTensor grads give the global norm)."""
    import torch

    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def evaluate(model, rows: list[Row], *, batch_size: int, pad_id: int, device: str, autocast, d) -> float | None:
    """Token-weighted validation loss over every rank's share of `rows`."""
    import torch

    if not rows:
        return None
    mine = rows[d.rank::d.world]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(mine), batch_size):
            chunk = mine[i:i + batch_size]
            part, n = batch_loss_sum(model, chunk, pad_id, device, autocast)
            total, count = total + part.item(), count + n
        for _ in range(lockstep_passes(d, len(rows), batch_size) - math.ceil(len(mine) / batch_size)):
            batch_loss_sum(model, rows[:1], pad_id, device, autocast)  # FSDP: join rank 0's all-gathers, count nothing
    model.train()
    total, count = distributed.all_sum(d, [total, float(count)])
    return total / count if count else None


def _checkpoint(run_dir: Path, st: LoopState, *, model, optimizer, scheduler, cfg, d, plan: BatchPlan,
                telemetry: Telemetry, ckpt_state: dict, sync: bool = True) -> None:
    """Rank 0 writes checkpoints/step-N (atomically, with every rank's RNG); the others wait for it.

    A step whose trainable weights or loss are not finite is never saved: every rank raises a ModelError that
    names the last good checkpoint. Sharded (FSDP): every rank first joins gathering the full weights and
    optimizer state to rank 0.
    """
    from mens.train.checkpoint import capture_rng, nonfinite_weights, not_finite_error

    bad = nonfinite_weights(model)  # this rank's shards; the verdict is summed so that every rank stops together
    n_bad = float(len(bad) + (not math.isfinite(st.last_loss)))
    if (distributed.all_sum(d, [n_bad])[0] if sync else n_bad) > 0:
        raise not_finite_error(run_dir, st.step, st.last_loss, bad)
    rng_by_rank = distributed.gather_objects(d, capture_rng()) if sync else [capture_rng()]
    weights = fsdp.full_weights(model, cfg.backend) if d.sharded else None
    optimizer_state = fsdp.full_optimizer_state(optimizer, d.main) if d.sharded else None
    if d.main:
        cursor = {"step": st.step, "epoch": (st.step - 1) // plan.steps_per_epoch}
        path = save_checkpoint(run_dir, st.step, model=model, backend=cfg.backend, optimizer=optimizer,
                               scheduler=scheduler, keep=cfg.keep_checkpoints, rng_by_rank=rng_by_rank,
                               state={**ckpt_state, "last_loss": st.last_loss, "val_loss": st.last_val_loss,
                                      "data_cursor": cursor}, weights=weights, optimizer_state=optimizer_state)
        telemetry.emit("checkpoint", step=st.step, path=str(path.relative_to(run_dir)))
    if sync:
        distributed.barrier(d)


def _refit(st: LoopState, *, total: int, ceiling: int, next_at: int, t_start: float, window: list,
           cfg, d, warmup: int, refits: list, ckpt_state: dict, telemetry: Telemetry,
           view: ProgressView) -> tuple[int, int]:
    """At the next of REFIT_AT's shares of the planned steps, re-fit the step count to the time limit
    (schedule.fit_to_time). Returns (total, index of the next share). Rank 0's clock decides for every rank.

    `window` is [time, step] where the step time is read from: the end of this process's first step (allocation
    and first-call kernels left out), then each re-fit's own moment. So a re-fit projects the remaining steps at
    the pace of the stretch just run, checkpoints included: a slow stretch that has ended (another job on the
    machine) is not carried into the rest of the run, and one that has begun is not averaged away."""
    if next_at >= len(REFIT_AT) or st.step < REFIT_AT[next_at] * total:
        return total, next_at
    next_at += 1
    t_window, s_window = window
    if st.step > max(warmup, s_window) and t_window is not None and st.step < total:
        now = time.time()
        step_s = (now - t_window) / (st.step - s_window)
        window[:] = [now, st.step]
        new = refit_total(step=st.step, elapsed_s=now - t_start, step_s=step_s, max_time_s=cfg.max_time_s,
                          ceiling=ceiling)
        new = int(distributed.all_sum(d, [float(new if d.main else 0)])[0])
        if new != total:
            if not refits:  # the curve as planned, so that the list alone describes it (resume, replay)
                refits.append([warmup, total])
            refits.append([st.step, new])  # checkpoints save it from ckpt_state, which holds this same list
            ckpt_state["total_steps"] = new
            telemetry.emit("refit", step=st.step, from_total=total, to_total=new, step_s=round(step_s, 3),
                           elapsed_s=round(now - t_start, 2), max_time_s=cfg.max_time_s)
            view.note(f"step {st.step}: {step_s:.2f} s a step, so {new} steps fit the time limit (were {total})")
            total = new
    # One re-fit a share and a step: the shares this step has reached, of the count planned after it, are done.
    while next_at < len(REFIT_AT) and st.step >= REFIT_AT[next_at] * total:
        next_at += 1
    return total, next_at


def _order_second_pass(plan: BatchPlan, first_losses: list[float], total: int, ckpt_state: dict,
                       telemetry: Telemetry, view: ProgressView) -> None:
    """At the start of the second pass: where the run ends inside it, the rows the first pass found hardest come
    first (`data.hardest_first`). The first pass's losses have then served: later checkpoints carry the order
    alone."""
    order = hardest_first(plan, first_losses, total)
    first_losses.clear()
    if order is None:
        return
    plan.second_pass = ckpt_state["second_pass"] = order
    reach = plan.second_pass_reach(total)
    telemetry.emit("second_pass", step=plan.steps_per_epoch, rows=plan.n_rows, hardest_first=reach)
    view.note(f"second pass: the {reach} of {plan.n_rows} rows the first pass found hardest come first "
              f"({total} steps end inside it)")


def validation_due(eval_every: int | str, step: int, steps_per_epoch: int) -> bool:
    """Whether `eval.eval_every` asks for a validation pass after `step` (the run's last step always has one):
    every N steps, or at the end of each epoch ("epoch"); 0 = none before the last."""
    every = steps_per_epoch if eval_every == "epoch" else int(eval_every)
    return bool(every) and step % every == 0


def train_loop(*, model, optimizer, scheduler, params: list, rows: list[Row], val_rows: list[Row],
               plan: BatchPlan, cfg, run_dir: Path, d, device: str, autocast, pad_id: int,
               start_step: int, telemetry: Telemetry, ckpt_state: dict, micro_rows: int | None = None,
               refits: list | None = None, warmup: int = 0, val_share: float = 1.0) -> LoopState:
    """Run optimizer steps start_step..plan.total_steps; the data cursor is the step number itself. `micro_rows`:
    rows per forward/backward pass (default cfg.batch_size; larger when mens.train.micro_batch merged passes).
    `val_share` < 1 validates on every k-th validation row only (k = round(1 / val_share)): a run that is timed
    rather than kept (dogfood's budget probe) learns what a whole pass costs from a part of it, and a budgeted run
    spends a part of the time; each `eval` event names the tokens it read and those of every validation row.

    With schedule.fit_to_time and a time limit, the step count is re-fitted as the run goes (`_refit`); `refits`
    is the list the scheduler reads, and gets each (step, new total)."""
    micro_rows = micro_rows or cfg.batch_size
    val_all_tokens = sum(row_tokens(r) for r in val_rows)
    if val_share < 1.0:  # every k-th row rather than the first ones: rows are packed in the data's order
        val_rows = val_rows[::max(1, round(1.0 / val_share))]
    val_tokens = sum(row_tokens(r) for r in val_rows)
    st = LoopState(step=start_step)
    total = plan.total_steps
    fitting = bool(cfg.fit_to_time and cfg.max_time_s) and refits is not None
    # Never longer than the recipe: the epochs' steps, or max_steps where that is longer, or what the caller gave.
    ceiling = max(total, cfg.fit_max_steps or math.ceil(cfg.epochs * plan.steps_per_epoch))
    next_at = sum(1 for share in REFIT_AT if share * total <= start_step)  # a resumed run: shares already passed
    view = ProgressView(total, start_step, enabled=d.main, every_s=cfg.log_every_s)
    model.train()
    t_start = time.time()
    window: list = [None, start_step + 1]  # where re-fits read the step time from (`_refit`)
    ema_step_s = None
    step = start_step
    # data.second_pass "hardest": each first-pass step's loss, then the second pass's order from them; both go into
    # checkpoints (ckpt_state), so a resumed run orders its second pass as the whole run would have.
    hardest = cfg.data.second_pass == "hardest"
    first_losses = ckpt_state.setdefault("first_pass_losses", []) if hardest else []
    try:
        while step < total:
            t0 = time.time()
            if hardest and step == plan.steps_per_epoch and plan.second_pass is None:
                _order_second_pass(plan, first_losses, total, ckpt_state, telemetry, view)
            # This rank's share of the global batch, then passes of micro_rows rows (batch_size unless merged).
            global_rows = plan.rows_for_step(step)
            mine = [rows[i] for i in global_rows[d.rank::d.world]]
            micro = step_passes(mine, micro_rows, merged=micro_rows != cfg.batch_size)  # grad_accum of them, or fewer
            n_sup, n_in = distributed.all_sum(d, [float(sum(row_supervised(r) for r in mine)),
                                                 float(sum(row_tokens(r) for r in mine))])
            loss_sum = accumulate_gradients(model, micro, n_sup, pad_id=pad_id, device=device, autocast=autocast,
                                            passes=lockstep_passes(d, len(global_rows), cfg.batch_size),
                                            filler=[rows[global_rows[0]]])
            distributed.all_sum_grads(d, params)
            (loss_sum,) = distributed.all_sum(d, [loss_sum])
            loss = loss_sum / n_sup
            if not math.isfinite(loss):
                raise ModelError(f"step {step + 1}: training loss is {loss} (not finite); lower --lr, check the data, "
                                 f"or resume from the last checkpoint in {run_dir / 'checkpoints'}")
            grad_norm = clip_gradients(params, cfg.max_grad_norm)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

            st.step = step + 1
            st.last_loss = loss
            st.losses.append(loss)
            if hardest and step < plan.steps_per_epoch and len(first_losses) == step:
                first_losses.append(loss)
            st.input_tokens += int(n_in)
            st.supervised_tokens += int(n_sup)
            dt = time.time() - t0
            ema_step_s = dt if ema_step_s is None else 0.8 * ema_step_s + 0.2 * dt
            eta = ema_step_s * (total - st.step)
            tok_s = n_in / dt if dt > 0 else 0.0
            telemetry.emit("step", step=st.step, total_steps=total, epoch=round(step / plan.steps_per_epoch, 4),
                           loss=loss, lr=lr, grad_norm=grad_norm, tokens=int(n_in), supervised_tokens=int(n_sup),
                           tokens_per_s=round(tok_s, 1), eta_s=round(eta, 1), progress=round(st.step / total, 4),
                           elapsed_s=round(time.time() - t_start, 2))
            view.update(st.step, total, loss, lr, tok_s, eta)
            if st.step == start_step + 1:
                window[0] = time.time()
            if fitting:
                total, next_at = _refit(st, total=total, ceiling=ceiling, next_at=next_at, t_start=t_start,
                                        window=window, cfg=cfg, d=d, warmup=warmup, refits=refits,
                                        ckpt_state=ckpt_state, telemetry=telemetry, view=view)
                plan.total_steps = total
            # Decided on rank 0's clock for every rank, so that all stop at the same step.
            out_of_time = bool(cfg.max_time_s) and st.step < total and distributed.all_sum(
                d, [float(d.main and time.time() - t_start >= cfg.max_time_s)])[0] > 0
            if out_of_time:
                st.stopped_early = True
                view.note(f"stopping at step {st.step} of {total}: the time limit ({cfg.max_time_s:.0f} s) is reached")
                telemetry.emit("time_limit", step=st.step, total_steps=total, max_time_s=cfg.max_time_s)

            if val_rows and (validation_due(cfg.eval_every, st.step, plan.steps_per_epoch) or st.step == total
                             or out_of_time):
                st.last_val_loss = evaluate(model, val_rows, batch_size=micro_rows, pad_id=pad_id,
                                            device=device, autocast=autocast, d=d)
                telemetry.emit("eval", step=st.step, val_loss=st.last_val_loss,
                               tokens=val_tokens, all_tokens=val_all_tokens)
                view.note(f"step {st.step}: val_loss {st.last_val_loss:.4f}")
            if cfg.save_every and st.step % cfg.save_every == 0 and st.step < total:
                _checkpoint(run_dir, st, model=model, optimizer=optimizer, scheduler=scheduler, cfg=cfg, d=d,
                            plan=plan, telemetry=telemetry, ckpt_state=ckpt_state)
            if _PAUSE_AFTER_STEP == st.step:  # test hook: hang here so a test can SIGKILL a run mid-way
                time.sleep(3600)
            if out_of_time:
                break
            step += 1
    except KeyboardInterrupt:  # Ctrl+C: keep the work done so far, then stop (resume with --resume)
        # Not when sharded: gathering the shards needs every rank, and another may be stuck mid-step.
        if st.step > start_step and d.main and not d.sharded:
            _checkpoint(run_dir, st, model=model, optimizer=optimizer, scheduler=scheduler, cfg=cfg, d=d,
                        plan=plan, telemetry=telemetry, ckpt_state=ckpt_state, sync=False)
            view.note(f"interrupted: saved checkpoints/step-{st.step}; continue with --resume")
        raise
    finally:
        view.close()
    st.train_seconds = time.time() - t_start
    return st

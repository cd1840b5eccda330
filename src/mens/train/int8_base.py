"""Frozen base projections in int8 while LoRA trains in f32 on a CPU (the path of CPUs without native bf16).

Why by hand: on such a CPU three quarters of a LoRA step are matmuls of the frozen base weights, running near the
f32 peak, so only cheaper arithmetic makes a step faster. Integer dot products are that: an int8 matmul
(`torch._int_mm`, oneDNN) against f32 was 1.49x on one decoder layer's projections, quantizing included
(bench/results/int8-matmul-avx2cap-vm.json). torch has no int8 linear with a backward pass on CPU (fbgemm's
dynamic-quant linear is inference-only and ignores oneDNN's ISA cap), so this is one autograd function: the forward
(x @ W^T) and the input gradient (dy @ W) both run in int8; the frozen weight gets no gradient.

Numerics: the weight is quantized once, per output channel; the activations and the incoming gradients per row, on
the fly. The weight keeps 7 bits (levels -63..63): without VNNI (AVX2, AVX-512 without VNNI) oneDNN multiplies
unsigned 8-bit activations (signed ones shifted by 128) with signed 8-bit weights in 16-bit pair sums that saturate
(on a CPU capped to AVX2, full-range 8-bit operands put `torch._int_mm`'s products 17-19% off; 7-bit weights cannot
saturate). The adapters, the optimizer, norms, attention and the LM head stay f32, and everything after training
(the saved adapter, eval, merge, serving) uses the f32 base: `bind` swaps the modules in, `restore` puts the
originals back.

No preset turns it on: on dogfood's recipe it trained about 1.2x the steps in the same time, but paired runs gave
no better model (docs/benchmarks.md, "Int8 frozen base projections (the f32 path)").
"""

from __future__ import annotations

import math
import platform

import torch

X86 = ("x86_64", "amd64")
"""CPUs whose int8 matmuls (oneDNN) were measured faster than f32; elsewhere (ARM, ...) the base stays f32."""
MIN_SPEEDUP = 1.2
"""How much faster than f32 this CPU's int8 projection (quantizing included) must run for the base to go int8.
x86 alone does not say: on a Zen 5 capped to AVX2 `torch._int_mm` went through oneDNN at 1.49x f32 for a decoder
layer, but on a real AVX2-only Zen 3 it ran at 0.03x (bench/results/int8-matmul-avx2cap-vm.json,
int8-matmul-avx2-zen3-vm.json), so a run there would have trained many times slower than in f32."""
SPEED_ROWS = 512
"""Rows of the timed product: about half a step of dogfood's recipe, so the fast kernels are in their regime."""
MAX_LOSS_SHIFT = 0.02
"""Largest relative change of the sample rows' loss that int8 may make (SmolLM2-135M, fresh adapter: 0.3%)."""
WEIGHT_LEVELS = 63
"""The weight's largest quantized magnitude (7 bits: products in oneDNN's 16-bit pairs cannot saturate)."""
SMOOTH_ALPHA = 0.5
"""SmoothQuant's split of each input channel's range between activation (alpha) and weight (1 - alpha)."""
ROW_LEVELS = 127
"""Activations' and gradients' largest quantized magnitude (8 bits, per row)."""


def _rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, features) f32 as int8 rows and their (rows, 1) scales: absmax / ROW_LEVELS per row."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30).div_(ROW_LEVELS)
    return torch.div(x, scale).round_().to(torch.int8), scale


class _Int8Frozen(torch.autograd.Function):
    """y = x @ W^T (+ bias) with W = (w8 * scale) / smooth (scale per output channel, smooth per input channel);
    gradient for x only."""

    @staticmethod
    def forward(ctx, x, w8, scale, inv_smooth, bias):
        ctx.save_for_backward(w8, scale, inv_smooth)
        ctx.in_shape = x.shape
        x8, sx = _rows_int8(x.reshape(-1, x.shape[-1]) * inv_smooth)
        y = torch._int_mm(x8, w8.t()).to(torch.float32).mul_(sx).mul_(scale)
        if bias is not None:
            y.add_(bias)
        return y.reshape(*x.shape[:-1], w8.shape[0])

    @staticmethod
    def backward(ctx, dy):
        w8, scale, inv_smooth = ctx.saved_tensors
        return input_grad_int8(dy, w8, scale, inv_smooth).reshape(ctx.in_shape), None, None, None, None


def input_grad_int8(dy: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, inv_smooth: torch.Tensor) -> torch.Tensor:
    """(rows, in) dy @ W for W = (w8 * scale) / smooth: the per-output-channel scale runs along dy's columns (the
    reduction), so it is folded into dy before dy is quantized; the smoothing divides the result's columns."""
    d8, sd = _rows_int8(dy.reshape(-1, w8.shape[0]).float() * scale)
    return torch._int_mm(d8, w8).to(torch.float32).mul_(sd).mul_(inv_smooth)


class Int8Linear(torch.nn.Module):
    """A frozen nn.Linear's stand-in: the weight in int8 (per output channel), f32 in and out."""

    def __init__(self, linear: torch.nn.Linear, act_absmax: torch.Tensor | None = None):
        super().__init__()
        w = linear.weight.detach().float()
        smooth = torch.ones(w.shape[1])
        if act_absmax is not None:  # SmoothQuant: move the activations' outlier channels into the weight
            a, wmax = act_absmax.float(), w.abs().amax(dim=0)
            # floors: a channel silent in the sample rows (or a zero weight column) must not get a huge factor
            a, wmax = a.clamp_min(1e-3 * float(a.max()) + 1e-12), wmax.clamp_min(1e-3 * float(wmax.max()) + 1e-12)
            smooth = a**SMOOTH_ALPHA / wmax ** (1 - SMOOTH_ALPHA)
            w = w * smooth
        self.register_buffer("inv_smooth", 1.0 / smooth, persistent=False)
        scale = w.abs().amax(dim=1).clamp_min(1e-30) / WEIGHT_LEVELS
        self.register_buffer("w8", torch.round(w / scale[:, None]).to(torch.int8), persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.__dict__["original"] = linear  # not a submodule: its weight stays out of this module's state

    @property
    def weight(self) -> torch.Tensor:
        """The original f32 weight (for code that reads a base layer's weight or dtype)."""
        return self.original.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Int8Frozen.apply(x, self.w8, self.scale, self.inv_smooth, self.bias)

    def input_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """grad @ W in int8, as this module's backward computes it (for the fused LoRA MLP's backward)."""
        return input_grad_int8(grad, self.w8, self.scale, self.inv_smooth).reshape(*grad.shape[:-1], self.in_features)


def bind_for_training(model, *, setting: str, device: str, amp: str | None, backend: str, sharded: bool,
                      calibrate) -> tuple[list, str | None]:
    """`model.int8_base` resolved: int8 base projections for a LoRA run in f32 on one x86 CPU process (`amp` None).

    The CPU's int8 projection is timed against f32 first (`int8_speedup`): below MIN_SPEEDUP the base stays f32.
    `calibrate()`: the model's mean token loss on a few sample rows, without gradients. Its first call sets the
    smoothing; a second, in int8, must stay within MAX_LOSS_SHIFT of the first, or the base stays f32 (a model whose
    activations int8 does not keep is trained as before, and the preflight says why). Returns what `restore` needs
    and the preflight note (None when int8 was not asked for or does not apply)."""
    if setting != "auto" or amp is not None or device != "cpu" or backend != "lora" or sharded:
        return [], None
    if platform.machine().lower() not in X86:  # measured on x86's oneDNN int8 kernels only
        return [], None
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    width = getattr(cfg, "hidden_size", None)
    timed_width = width or 576  # a config without hidden_size: a small model's width, only for the timing
    speedup = int8_speedup(timed_width)
    if speedup < MIN_SPEEDUP:
        return [], (f"kept in f32: this CPU ran a {SPEED_ROWS} x {timed_width} projection {speedup:.2f}x as fast "
                    f"in int8 as in f32 (below {MIN_SPEEDUP}x: torch has no fast int8 matmul for this CPU); "
                    "set model.int8_base: off to skip the check")
    f32_loss: list[float] = []
    swapped, kept = bind(model, lambda: f32_loss.append(calibrate()), width=width)
    if not swapped:
        return [], None
    int8_loss = calibrate()
    shift = abs(int8_loss - f32_loss[0]) / max(abs(f32_loss[0]), 1e-12)
    sample = f"loss on sample rows {f32_loss[0]:.4f} in f32, {int8_loss:.4f} in int8"
    if not math.isfinite(int8_loss) or shift > MAX_LOSS_SHIFT:
        restore(swapped)
        return [], (f"kept in f32: {sample} (more than {MAX_LOSS_SHIFT:.0%} apart; this model's activations do not "
                    "survive int8); set model.int8_base: off to skip the check")
    rest = f"; {kept} reading another width (the MLP's down projection) stay f32" if kept else ""
    return swapped, (f"{len(swapped)} frozen base projections in int8 (7-bit weights, per-row activations and "
                     f"gradients, smoothed){rest}; {sample}; adapters and everything after training in f32")


def int8_speedup(width: int, rows: int = SPEED_ROWS, repeats: int = 3) -> float:
    """f32 time over int8 time of a frozen (width -> width) projection's forward on `rows` rows, quantizing and
    dequantizing included, best of `repeats` after one untimed call each: what `Int8Linear` would save here."""
    import time

    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(width, width, bias=False)
    torch.nn.init.normal_(linear.weight, std=width**-0.5, generator=gen)
    q, x = Int8Linear(linear), torch.randn(rows, width, generator=gen)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    with torch.no_grad():
        return best(lambda: linear(x)) / max(best(lambda: q(x)), 1e-9)


def bind(model, calibrate=None, *, width: int | None = None) -> tuple[list[tuple[object, torch.nn.Linear]], int]:
    """Swap the frozen nn.Linear base of the LoRA-adapted projections for Int8Linear; returns what `restore` needs
    and how many adapted projections were kept. Only f32 CPU weights that do not train are swapped, and with
    `width` only those that read that many features: the MLP's down projection reads the gated product, whose
    outlier channels per-row int8 does not keep (SmolLM2-135M with a trained adapter, capped CPU: the loss moved
    2.6% per batch, at most 9.9%, with it in int8, and 1.9%, at most 3.4%, without; bench/int8_numerics.py).

    `calibrate()`: runs the model on sample rows; each projection's per-channel input magnitudes seen there set its
    smoothing (SmoothQuant, alpha 0.5: a channel's range is split between activation and weight, so one outlier
    channel no longer flattens a whole row's int8 levels)."""
    from peft.tuners.lora import LoraLayer

    adapted = [m for m in model.modules() if isinstance(m, LoraLayer) and type(getattr(m, "base_layer", None)) is
               torch.nn.Linear and not m.base_layer.weight.requires_grad
               and m.base_layer.weight.dtype == torch.float32 and m.base_layer.weight.device.type == "cpu"]
    targets = [m for m in adapted if width is None or m.base_layer.in_features == width]
    stats: dict = {}
    if calibrate is not None and targets:
        def hook(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0).float()
            stats[module] = torch.maximum(stats[module], x) if module in stats else x

        handles = [m.base_layer.register_forward_pre_hook(hook) for m in targets]
        try:
            with torch.no_grad():
                calibrate()
        finally:
            for h in handles:
                h.remove()
    swapped = []
    for module in targets:
        base = module.base_layer
        module.base_layer = Int8Linear(base, stats.get(base))
        swapped.append((module, base))
    return swapped, len(adapted) - len(targets)


def restore(swapped: list[tuple[object, torch.nn.Linear]]) -> None:
    """Put the original f32 projections back (the model then computes exactly as before `bind`)."""
    for module, base in swapped:
        module.base_layer = base

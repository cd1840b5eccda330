"""Next-token loss without the vocabulary wall: the LM head and its f32 logits a few hundred rows at a time.

The plain loss builds (supervised tokens x vocabulary) logits plus an f32 copy and the softmax saved for backward:
with a 151,936-token vocabulary at 4 x 2048 supervised tokens that is ~15 GB, more than a small model itself. Here
the model's own forward runs with a pre-hook on its output embeddings (the LM head, found with
`get_output_embeddings()` through any peft wrapper) that keeps the final hidden states of the supervised positions
and lets only one row through the head. The loss is then summed chunk by chunk: for a plain `nn.Linear` head each
chunk's gradients are computed in the forward pass (`_LinearCrossEntropy`, as fused kernels do), for any other head
each chunk's logits are recomputed in backward (`torch.utils.checkpoint`); either way one chunk's logits at a time.

Running the whole forward (not the decoder body alone) keeps FSDP's root hooks and every architecture's own
embedding, norm and slicing; what comes after the head is reproduced from the config (scale, final softcap) and
checked once per model on that one row against the model's own logits. Where the head is not called as a module,
or the check fails, the plain path computes the loss.

On CUDA with Liger Kernel installed (`pip install mens[gpu]`), its fused linear cross-entropy replaces the chunk
loop for a plain `nn.Linear` head. Measured against this file's own loop with 4x larger chunks (Qwen2.5-0.5B, 2 x
2,048-token rows, H100): as fast for LoRA, 1.3x faster for QLoRA, and 1.2-1.5 GB less memory
(bench/results/gpu_train_speed-h100.json). `FUSED_CE = "off"` keeps the loop (the benchmark's A/B).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK_ELEMENTS = 2**25  # logits per chunk: 128 MB in f32, ~220 rows at a 152k vocabulary, 4096 rows at 8k
FUSED_CE = "auto"  # "auto": Liger's fused linear CE where usable (CUDA, plain Linear head); "off": the chunk loop
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # head module -> its split was verified (bool)
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadMath:
    """What a causal LM does to its head's output before returning logits: scale, then final softcapping."""

    multiply: float | None = None  # cohere `logit_scale`, falcon_h1 `lm_head_multiplier`
    divide: float | None = None  # granite `logits_scaling`
    softcap: float | None = None  # gemma2/3 `final_logit_softcapping`: cap * tanh(logits / cap)

    def apply(self, z):
        """The same operations as the models' forwards, in the same order and dtype."""
        if self.multiply is not None:
            z = z * self.multiply
        if self.divide is not None:
            z = z / self.divide
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    def grad(self, g, y):
        """d(loss)/d(head output) from d(loss)/d(logits) `g` and the logits `y` (f32, in place on g)."""
        if self.softcap is not None:  # y = c tanh(u / c): dy/du = 1 - (y / c)^2
            g.mul_(1.0 - (y / self.softcap).square())
        if self.divide is not None:
            g.div_(self.divide)
        if self.multiply is not None:
            g.mul_(self.multiply)
        return g


def head_math(model) -> HeadMath:
    """The post-head operations named by the (text) config; anything else is caught by the one-row check."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    def num(name: str) -> float | None:
        v = getattr(cfg, name, None)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return HeadMath(multiply=num("logit_scale") or num("lm_head_multiplier"), divide=num("logits_scaling"),
                    softcap=num("final_logit_softcapping"))


def chunk_rows(vocab: int) -> int:
    """Rows per chunk so one chunk's logits hold about CHUNK_ELEMENTS values (16..4096 rows)."""
    return max(16, min(4096, CHUNK_ELEMENTS // max(1, vocab)))


def plain_loss_sum(model, inputs: dict, keep, target, autocast):
    """Sum of token CE with the model's own logits at the kept positions ((N, V) logits and an f32 copy)."""
    with autocast():
        logits = model(**inputs, logits_to_keep=keep).logits  # (N, V)
    return F.cross_entropy(_kept(logits, keep).float(), target, reduction="sum")


def _kept(logits, keep):
    """(N, V) logits of the kept positions, also from a forward that ignored `logits_to_keep` ((B, T, V))."""
    if logits.dim() == 3 and tuple(logits.shape[:2]) == tuple(keep.shape):
        return logits[keep]
    return logits.reshape(-1, logits.shape[-1])


def supervised_loss_sum(model, inputs: dict, keep, target, autocast, *, rows: int | None = None):
    """Sum of next-token CE over the positions `keep` ((B, T) bool: position t predicts a supervised token t+1).

    `inputs`: the model's keyword inputs (input_ids, position_ids, ...); `target`: (N,) the supervised tokens in
    `keep`'s row-major order. Returns a 0-dim f32 tensor carrying the gradient. `rows`: chunk size (default: by
    vocabulary, `chunk_rows`).
    """
    head = model.get_output_embeddings()
    if head is None or _CHECKED.get(head) is False:
        return plain_loss_sum(model, inputs, keep, target, autocast)
    seen: dict = {}
    handle = head.register_forward_pre_hook(_capture(keep, seen, int(target.shape[0])), with_kwargs=True)
    try:
        with autocast():
            out = model(**inputs, logits_to_keep=keep)
    finally:
        handle.remove()
    if "h" not in seen:  # the head never ran as a module (or saw an unknown shape): these are the plain logits
        _mark(head, False, "the LM head is not called as a module with the hidden states")
        return _ce_sum(_kept(out.logits, keep), target)
    h, math = seen["h"], head_math(model)  # h: (N, H) final hidden states of the supervised positions
    if head not in _CHECKED and h.shape[0]:
        with torch.no_grad(), autocast():
            mine = math.apply(head(seen["probe"])).float()
        theirs = out.logits.detach().float()
        ok = mine.shape == theirs.shape and bool((mine - theirs).abs().max() <= 1e-5 * (1 + theirs.abs().max()))
        _mark(head, ok, f"its logits differ from {math} applied to the head's output")
        if not ok:
            return plain_loss_sum(model, inputs, keep, target, autocast)
    if _fused_usable(head, h, math):
        return _fused_loss_sum(head, h, target, math, autocast)
    rows = rows or chunk_rows(_vocab(head, out))
    if _plain_linear(head):
        return linear_loss_sum(head, h, target, math, autocast, rows=rows)
    return chunked_loss_sum(head, h, target, math, autocast, rows=rows)


def _capture(keep, seen: dict, n: int):
    """Pre-hook on the head: keep its input at the supervised positions (`n` of them: counted by the caller, so no
    device sync here), pass only the first row through."""

    def hook(module, args, kwargs):
        h = args[0] if args else kwargs.get("input")
        if h is None or h.dim() not in (2, 3):
            return None
        if h.dim() == 3 and tuple(h.shape[:2]) == tuple(keep.shape):  # the forward ignored logits_to_keep
            seen["h"], probe = h[keep], h[:1, :1]
        elif h.dim() == 2 and h.shape[0] == n:  # the forward applied the boolean mask: (N, H)
            seen["h"], probe = h, h[:1]
        else:
            return None
        seen["probe"] = probe
        return ((probe, *args[1:]), kwargs) if args else ((), {**kwargs, "input": probe})

    return hook


def _mark(head, ok: bool, why: str) -> None:
    if head not in _CHECKED and not ok:
        _log.warning("chunked loss disabled for %s: %s; using full logits (more memory)", type(head).__name__, why)
    _CHECKED[head] = ok


def _vocab(head, out) -> int:
    w = getattr(head, "weight", None)
    return int(w.shape[0]) if w is not None and w.dim() == 2 else int(out.logits.shape[-1])


def _ce_sum(logits, target):
    return F.cross_entropy(logits.float(), target, reduction="sum")


def _chunk_ce(head, math: HeadMath, autocast, h, target):
    with autocast():
        logits = math.apply(head(h))  # (rows, V) in the head's dtype
    return _ce_sum(logits, target)


def chunked_loss_sum(head, h, target, math: HeadMath, autocast, *, rows: int):
    """Sum of CE over `rows`-row chunks of h (N, H); in backward each chunk's logits are recomputed, one at a time."""
    total = None
    for i in range(0, h.shape[0], rows):
        hc, tc = h[i:i + rows], target[i:i + rows]
        if torch.is_grad_enabled():
            part = checkpoint(_chunk_ce, head, math, autocast, hc, tc, use_reentrant=False, preserve_rng_state=False)
        else:
            part = _chunk_ce(head, math, autocast, hc, tc)
        total = part if total is None else total + part
    return h.float().sum() * 0.0 if total is None else total  # N == 0: a zero that still carries the graph


def _plain_linear(head) -> bool:
    """A head whose output is exactly F.linear(h, weight, bias): no adapter, no 4-bit storage, no wrapper."""
    return type(head) is torch.nn.Linear and type(head.weight) in (torch.Tensor, torch.nn.Parameter)


def linear_loss_sum(head, h, target, math: HeadMath, autocast, *, rows: int):
    """Chunked CE of a plain Linear head that computes its gradients chunk by chunk in the forward pass, as fused
    kernels do: no logits are kept for backward and none are recomputed (a checkpointed chunk would run the head
    three times instead of two)."""
    if not torch.is_grad_enabled():
        return chunked_loss_sum(head, h, target, math, autocast, rows=rows)
    return _LinearCrossEntropy.apply(h, head.weight, head.bias, target, math, autocast, rows)


class _LinearCrossEntropy(torch.autograd.Function):
    """CE sum of F.linear(h, weight, bias) then `math`, chunk by chunk; the gradients are worked out in forward
    and only scaled by the incoming gradient in backward."""

    @staticmethod
    def forward(ctx, h, weight, bias, target, math, autocast, rows):
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dtype = _matmul_dtype(autocast, h.device.type, weight.dtype)
        w = weight.to(dtype)  # cast once (autocast would cast a frozen head's weight for every chunk)
        b = None if bias is None else bias.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        gh = torch.zeros_like(h) if need_h else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        gb = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for i in range(0, h.shape[0], rows):
            hc, tc = h[i:i + rows].to(dtype), target[i:i + rows]
            z = F.linear(hc, w, b)  # (rows, V): what the head computes, under autocast too
            y = math.apply(z).float()
            del z  # one (rows, V) f32 tensor alive from here on (y, then g in its place)
            lse = torch.logsumexp(y, dim=-1)
            total += (lse - y.gather(1, tc[:, None]).squeeze(1)).sum()
            # softmax; minus one at the target = d(CE sum)/d(logits). In y's place unless the softcap's
            # derivative still needs the logits.
            g = (y.sub(lse[:, None]) if math.softcap is not None else y.sub_(lse[:, None])).exp_()
            g[torch.arange(len(tc), device=g.device), tc] -= 1.0
            g = math.grad(g, y).to(dtype)  # (rows, V): d(CE sum)/d(head output)
            if need_h:
                gh[i:i + rows] = g @ w
            if need_w:
                gw += (g.t() @ hc).float()
            if need_b:
                gb += g.float().sum(0)
        ctx.save_for_backward(*(t for t in (gh, gw, gb) if t is not None))
        ctx.needs, ctx.dtypes = (need_h, need_w, need_b), (weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        saved = iter(ctx.saved_tensors)
        need_h, need_w, need_b = ctx.needs
        gh = next(saved) * grad_out if need_h else None
        gw = (next(saved) * grad_out).to(ctx.dtypes[0]) if need_w else None
        gb = (next(saved) * grad_out).to(ctx.dtypes[1]) if need_b else None
        return gh, gw, gb, None, None, None, None


def _matmul_dtype(autocast, device_type: str, dtype):
    """The dtype autocast runs matmuls in on this device (bf16 under mens' autocast), else the weight's own."""
    with autocast():
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    return dtype


def _fused_usable(head, h, math: HeadMath) -> bool:
    """Liger's fused kernel unless FUSED_CE is "off": CUDA, a plain Linear head (not 4-bit, no adapter on it), no
    division after the head."""
    if FUSED_CE == "off" or h.device.type != "cuda" or type(head) is not torch.nn.Linear or math.divide is not None:
        return False
    if math.multiply is not None and head.bias is not None:  # the scale folds into h only without a bias
        return False
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # noqa: F401
    except ImportError:
        return False
    return True


def _fused_loss_sum(head, h, target, math: HeadMath, autocast):
    """Liger's fused linear cross-entropy (logits never materialised beyond its own chunks); scale folded into h."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    fn = LigerFusedLinearCrossEntropyLoss(ignore_index=-100, reduction="sum", softcap=math.softcap)
    with autocast():
        x = h if math.multiply is None else h * math.multiply
        if x.dtype != head.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            x = x.to(head.weight.dtype)
        return fn(head.weight, x, target, head.bias).float()

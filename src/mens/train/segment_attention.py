"""Attention over packed rows one example at a time, for training.

Why: transformers attends a packed row of T tokens with one (T x T) block-diagonal causal mask built from the
position ids, and torch's CPU attention kernel then works through the whole row, computing the blocks between
examples only to mask them out: a 512-token row of three examples costs about what one 512-token example costs.
Attending each example on its own, causal and without a mask, does only the work inside each example's triangle:
on SmolLM2-135M with 2 packed 512-token rows a step, 1.12x the supervised tokens/s of the block mask, the same loss
(bench/results/train_speed-segments-vm.json). The packed batch is flattened into one row with the examples'
boundaries (`cu_seq_lens_q`, transformers' varlen arguments, as for recurrent layers), and the attention function
is registered with transformers' AttentionInterface and set on this model instance only. transformers builds no
mask for an attention function it does not know, so no (T x T) mask is built at all.

On CUDA the same flattened row goes to torch's varlen flash attention (`torch.nn.attention.varlen`, bf16/fp16), one
call for every example of the batch, instead of the memory-efficient kernel working through the (T x T) mask (its
speed and memory on a GPU: docs/gpu.md). Bound only for softmax-attention models whose implementation is "sdpa" or
"eager", and only when the model's logits on a packed probe batch match its own attention's and a backward pass
through it runs. Sliding windows are honoured inside each example; attention forms this function does not reproduce
(logit softcapping, attention sinks, position biases; on CUDA also f32 outside autocast and attention dropout) fail
the probe or the checks before it and keep the model's own attention. A micro-batch's common prompt prefix is laid
out once (`packing.collate_shared`; each example attends to it as to its own copy), bound by a second probe of its
own.
The model's implementation is restored after training (`restore_attention`), and it is never saved: transformers
leaves `_attn_implementation` out of config.json.
"""

from __future__ import annotations

import functools
import inspect
import weakref

from mens.train.packing import ISOLATION_TOLERANCE  # the probes' bar: the preflight leak check's

SEGMENT_ATTENTION = "auto"  # "auto": per-example attention for packed rows where it matches; "off": the block mask
SHARED_PREFIX = "auto"  # "auto": a micro-batch's common prefix laid out once where it matches; "off": never
_SHARING: weakref.WeakSet = weakref.WeakSet()  # models (without a peft wrapper) bound to share prefixes
F32_ATTENTION_MAX_TOKENS = 384
"""On CPU under bf16 autocast, a call whose examples are all at most this long (a shared prefix counted in)
attends in f32, then hands its output back in bf16 as autocast would. torch's CPU flash kernel has a large fixed
cost per call in bf16, so f32 is several times faster on short examples and no slower up to about this length
(docs/benchmarks.md, "Attention in f32 for short examples, measured inside one run"); dogfood's examples are mostly
short. f32 is the more exact of the two. 0 keeps autocast's dtype for every call."""
NAME = "mens_segments"


def segment_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                              scaling: float | None = None, is_causal: bool | None = None, cu_seq_lens_q=None,
                              sliding_window: int | None = None, softcap: float | None = None, s_aux=None,
                              position_bias=None, shared_prefix_len: int = 0, shared_prefix_end: int = 0,
                              shared_key_index=None, **kwargs):
    """transformers' attention-function signature: query (B, H, T, D), key/value (B, KV, S, D) -> ((B, T, H, D), None).

    Each example (the spans between `cu_seq_lens_q` boundaries of a flattened batch, or each row without them) is
    attended causally on its own. With `shared_prefix_len` P (`packing.collate_shared`), the examples that start
    in [P, shared_prefix_end) attend to the first P tokens before their own, as to their own copy of them (on
    CUDA through `shared_key_index`, each example's keys gathered in order, and `cu_seq_lens_k`). A call
    this cannot serve exactly (a mask handed in, a KV cache, softcapping, sinks,
    a position bias, non-causal attention) raises NotImplementedError: the binding probe then keeps the model's own
    attention, and after binding such a call is a bug to report, never a silent wrong answer."""
    import torch

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if (attention_mask is not None or softcap is not None or s_aux is not None or position_bias is not None
            or not causal or query.shape[2] != key.shape[2]):
        raise NotImplementedError("per-example attention serves causal self-attention over packed rows only")
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    if cu_seq_lens_q is not None and query.shape[0] != 1:
        raise NotImplementedError("varlen boundaries come with a batch flattened into one row")
    if _use_flash(query):
        if shared_prefix_len and shared_key_index is None:
            raise NotImplementedError("a shared prefix on CUDA needs each example's key positions")
        shared = None
        if shared_prefix_len:
            shared = (shared_key_index, kwargs.get("cu_seq_lens_k"), kwargs.get("max_length_k"))
        return _flash_varlen(query, key, value, cu_seq_lens_q, kwargs.get("max_length_q"), p, scaling,
                             sliding_window, gqa, shared=shared), None
    bounds = [0, query.shape[2]] if cu_seq_lens_q is None else [int(b) for b in cu_seq_lens_q.tolist()]
    prefix = (shared_prefix_len, shared_prefix_end)
    half = _f32_instead_of(query, bounds, prefix)
    if half is None:
        return _each_example(query, key, value, bounds, p, scaling, sliding_window, gqa, prefix), None
    with torch.autocast("cpu", enabled=False):
        out = _each_example(query.float(), key.float(), value.float(), bounds, p, scaling, sliding_window, gqa, prefix)
    return out.to(half), None


def _each_example(query, key, value, bounds: list[int], p: float, scaling, sliding_window, gqa: bool,
                  prefix: tuple[int, int]):
    """The CPU form: each example between `bounds` attended on its own by torch's sdpa, (B, T, H, D) out. `prefix`:
    (length, end of the examples that start after it) of a shared-prefix layout, (0, 0) without one."""
    import torch
    import torch.nn.functional as F

    shared_prefix_len, shared_prefix_end = prefix
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end <= start:
            continue
        q, k, v = query[:, :, start:end], key[:, :, start:end], value[:, :, start:end]
        n = end - start
        if shared_prefix_len and shared_prefix_len <= start < shared_prefix_end:
            m = shared_prefix_len
            k = torch.cat((key[:, :, :m], k), dim=2)
            v = torch.cat((value[:, :, :m], v), dim=2)
            gap = (torch.arange(n, device=query.device)[:, None] + m
                   - torch.arange(m + n, device=query.device)[None, :])  # query position - key position
            mask = (gap >= 0) if sliding_window is None else (gap >= 0) & (gap < sliding_window)
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scaling,
                                                       enable_gqa=gqa))
        elif sliding_window is not None and n > sliding_window:
            i = torch.arange(n, device=query.device)
            gap = i[:, None] - i[None, :]  # query index - key index
            mask = (gap >= 0) & (gap < sliding_window)
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scaling,
                                                       enable_gqa=gqa))
        else:
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p, scale=scaling,
                                                       enable_gqa=gqa))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous()


def _use_flash(query) -> bool:
    return query.is_cuda


def _f32_instead_of(query, bounds: list[int], prefix: tuple[int, int]):
    """The half dtype that CPU autocast would attend in, where this call should attend in f32 instead (every
    example's keys, a shared prefix's included, at most F32_ATTENTION_MAX_TOKENS); else None."""
    import torch

    if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return None
    half = torch.get_autocast_dtype("cpu")
    length, end = prefix
    keys = [b - a + (length if length and length <= a < end else 0)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    short = max(keys, default=0) <= F32_ATTENTION_MAX_TOKENS
    return half if short and half in (torch.bfloat16, torch.float16) else None


def _flash_varlen(query, key, value, cu_seq_lens, max_length, dropout: float, scaling, sliding_window, gqa: bool,
                  shared=None):
    """The CUDA form: every example of the flattened row in one call of torch's varlen flash attention (half
    precision only). (1, H, T, D) in, (1, T, H, D) out; without boundaries each row of the batch is one example.

    `shared` = (key index, cu_seq_lens_k, max_length_k) of a shared-prefix layout: each example's keys and values
    are gathered (the prefix's, then its own) so that its queries attend causally to the end of its key span, the
    kernel's alignment when a span has more keys than queries. The binding probe checks that alignment against
    each example alone before any training step uses it."""
    import torch
    from torch.nn.attention import varlen

    if dropout:
        raise NotImplementedError("torch's varlen flash attention has no dropout")
    kind = query.device.type
    if query.dtype == torch.float32 and torch.is_autocast_enabled(kind):
        # what sdpa does under autocast: an f32 model's rotary output is f32 (its cos/sin are), autocast's dtype
        # is what the block mask's attention would compute in
        half = torch.get_autocast_dtype(kind)
        query, key, value = query.to(half), key.to(half), value.to(half)
    if query.dtype not in (torch.bfloat16, torch.float16):
        raise NotImplementedError(f"flash attention takes bf16 or fp16, not {query.dtype}")
    b, _, t, _ = query.shape
    if cu_seq_lens is None:
        cu_seq_lens = torch.arange(0, (b + 1) * t, t, device=query.device, dtype=torch.int32)
        max_length = t
    elif max_length is None:
        max_length = int((cu_seq_lens[1:] - cu_seq_lens[:-1]).max())
    q, k, v = (x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]) for x in (query, key, value))  # (B*T, H, D)
    window = (sliding_window - 1, 0) if sliding_window is not None else (-1, 0)  # (-1, 0): causal
    cu = cu_seq_lens.to(torch.int32)
    cu_k, max_k = cu, max_length
    if shared is not None:
        index, cu_k, max_k = shared
        k, v = k.index_select(0, index), v.index_select(0, index)  # backward sums the prefix's gradients
        cu_k = cu_k.to(torch.int32)
    gqa_kw = {"enable_gqa": gqa} if _takes_enable_gqa(varlen.varlen_attn) else {}
    out = varlen.varlen_attn(q, k, v, cu, cu_k, int(max_length), int(max_k), scale=scaling,
                             window_size=window, **gqa_kw)
    return out.reshape(b, t, *out.shape[1:])


@functools.lru_cache(maxsize=4)
def _takes_enable_gqa(fn) -> bool:
    """Newer torch (2.13) asks for `enable_gqa=True` when keys have fewer heads than queries; torch 2.11 has no such
    argument and hands fewer key heads straight to the flash kernel, which serves them as grouped-query attention
    (the binding probe checks either against the block mask)."""
    params = inspect.signature(fn).parameters
    return "enable_gqa" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def register() -> None:
    """Make NAME a transformers attention implementation (process-wide; idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, segment_attention_forward)


def uses_segment_attention(model) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == NAME


def shares_prefix(model) -> bool:
    """Whether this model's micro-batches lay their common prefix out once (`packing.collate_shared`)."""
    return uses_segment_attention(model) and _pretrained(model) in _SHARING


def _pretrained(model):
    """The transformers model inside a peft wrapper (set_attn_implementation lives there)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def bind_segment_attention(model, device: str, autocast, vocab: int) -> tuple[str | None, str | None]:
    """Switch this model to per-example attention where it applies and matches the model's own on a probe.
    Returns (the implementation to restore after training or None, the preflight note or None)."""
    from mens.train.packing import has_recurrent_layers

    cuda = str(device).startswith("cuda")
    if SEGMENT_ATTENTION == "off" or not (cuda or str(device) == "cpu"):
        return None, None
    base = _pretrained(model)
    own = getattr(base.config, "_attn_implementation", None)
    if own not in ("sdpa", "eager") or has_recurrent_layers(base) or not hasattr(base, "set_attn_implementation"):
        return None, None
    if cuda:
        text = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
        if float(getattr(text, "attention_dropout", 0.0) or 0.0) > 0:
            return None, f"kept {own} attention: flash varlen attention has no attention dropout"
        try:
            from torch.nn.attention import varlen  # noqa: F401  (torch >= 2.10)
        except ImportError:
            import torch

            return None, (f"kept {own} attention over the block mask: torch {torch.__version__} has no varlen "
                          "flash attention (torch >= 2.10 has it: docs/gpu.md)")
    register()
    try:
        diff = _probe(model, base, own, device, autocast, vocab)
    except (NotImplementedError, ValueError, TypeError, RuntimeError) as e:  # a form or a kernel it cannot serve
        base.set_attn_implementation(own)
        return None, f"kept {own} attention: per-example attention does not serve this model ({_first_line(e)})"
    if diff is not None:
        base.set_attn_implementation(own)
        return None, f"kept {own} attention: per-example attention differs from it on a probe ({diff:.2g} of scale)"
    how = "torch's varlen flash attention" if cuda else f"{own}'s kernel without the block mask"
    note = f"packed rows attend one example at a time ({how}; matched on a probe)"
    if SHARED_PREFIX != "off":
        shared = _bind_shared_prefix(model, base, device, autocast, vocab)
        note += "; " + shared
    return own, note


def _bind_shared_prefix(model, base, device: str, autocast, vocab: int) -> str:
    """Share micro-batches' common prefixes when the shared layout gives every example its own logits on a probe
    and a backward pass runs through it; the note says which."""
    from mens.train.packing import collate_shared, model_inputs, shared_layout_error, shared_probe_rows

    try:
        diff = shared_layout_error(model, device, autocast, vocab)
        if diff > ISOLATION_TOLERANCE:
            return f"a common prompt prefix is attended per example (the shared layout differs on a probe: {diff:.2g})"
        batch = collate_shared(shared_probe_rows(vocab))
        with autocast():
            model(**model_inputs(model, batch, device, packed=True)).logits.float().sum().backward()
    except (NotImplementedError, ValueError, TypeError, RuntimeError) as e:
        return f"a common prompt prefix is attended per example ({_first_line(e)})"
    finally:
        for param in model.parameters():
            param.grad = None
    _SHARING.add(base)
    return "a micro-batch's common prompt prefix is computed once (matched on a probe)"


def restore_attention(model, own: str | None) -> None:
    if own is not None:
        _SHARING.discard(_pretrained(model))
        _pretrained(model).set_attn_implementation(own)


def _probe(model, base, own: str, device: str, autocast, vocab: int) -> float | None:
    """Logits of a packed 2-row batch under the model's own attention and under NAME (left set when they match),
    then one backward pass through NAME (a kernel without a backward fails here, not at step 1; the gradients are
    dropped). Returns None on a match, else the largest difference relative to the logits' scale."""
    import torch

    from mens.train.packing import collate, model_inputs, probe_rows

    batch = collate(probe_rows(vocab), 0)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast():
            ref = model(**model_inputs(model, batch, device, packed=True)).logits.float()
        base.set_attn_implementation(NAME)
        with autocast():
            got = model(**model_inputs(model, batch, device, packed=True)).logits.float()
        if got.requires_grad:
            got.sum().backward()
    finally:
        model.train(was_training)
        for param in model.parameters():
            param.grad = None
    got = got.detach().reshape(ref.shape)
    scale = float(ref.abs().max()) or 1.0
    diff = float((got - ref).abs().max()) / scale
    return None if diff <= ISOLATION_TOLERANCE else diff


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__

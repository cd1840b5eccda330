"""Packing examples into rows and collating rows into tensors.

Examples in one row never see each other: position ids restart at 0 for every example, and the model is
called without a 2D attention mask, so transformers (>= 4.5x masking_utils) builds a block-diagonal causal
mask from the position ids (flash-attention kernels use the same ids as varlen boundaries). Linear-attention
layers (Gated DeltaNet, Mamba-style mixers) ignore position ids: for them a packed batch is flattened into one
row with explicit boundaries (`cu_seq_lens_*` for the chunked delta rule, `seq_idx` for the short convolution),
the arguments transformers hands to flash-linear-attention and causal-conv1d. Softmax attention takes the same
flattened row and boundaries where `mens.train.segment_attention` applies (it attends one example at a time
instead of through a block mask). Padding is its own segment with label -100.

Where per-example attention is bound, the examples of one micro-batch that begin with the same tokens
(the chat template and system prompt, identical in every prompt/response row) share that prefix: it is laid out
once, each example's remaining tokens continue its position ids and attend to it as to their own copy
(`collate_shared`). Every supervised token sees exactly the context it would see alone, so the loss and gradients
are those of the unshared batch (up to float summation order), with (examples - 1) x prefix fewer tokens through
the model. The recipe's rows, steps and batches do not change.
"""

from __future__ import annotations

from mens.train.text import IGNORE, Example

Row = list[Example]


def pack_examples(examples: list[Example], seq_len: int, *, window: int = 64) -> list[Row]:
    """First-fit packing in the given order, looking back at most `window` open rows (deterministic)."""
    rows: list[Row] = []
    room: list[int] = []
    for ex in examples:
        n = len(ex.ids)
        for i in range(max(0, len(rows) - window), len(rows)):
            if room[i] >= n:
                rows[i].append(ex)
                room[i] -= n
                break
        else:
            rows.append([ex])
            room.append(seq_len - n)
    return rows


def row_tokens(row: Row) -> int:
    return sum(len(ex.ids) for ex in row)


def row_supervised(row: Row) -> int:
    return sum(ex.n_supervised for ex in row)


def collate(rows: list[Row], pad_id: int):
    """Rows -> dict of (B, T) long tensors: input_ids, labels, position_ids (T = longest row)."""
    import torch

    width = max(row_tokens(r) for r in rows)
    ids, labels, pos = [], [], []
    for row in rows:
        r_ids, r_lab, r_pos = [], [], []
        for ex in row:
            r_ids += ex.ids
            r_lab += ex.labels
            r_pos += list(range(len(ex.ids)))
        pad = width - len(r_ids)
        ids.append(r_ids + [pad_id] * pad)
        labels.append(r_lab + [IGNORE] * pad)
        pos.append(r_pos + list(range(pad)))
    return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "position_ids": torch.tensor(pos)}


MIN_SHARED_PREFIX = 8
"""Shortest common prefix laid out once per micro-batch; shorter ones are not worth an extra attention segment."""
ISOLATION_TOLERANCE = 0.05
"""How far packed logits may stand from each example's own, relative to the largest logit, before packing or a
layout counts as leaking: rounding alone is ~1e-6 in f32, ~1% under bf16 on a CPU and 2.6-2.7% for a 28-layer
4-bit base in bf16 on an H200 (bench/results/gpu_train_speed-varlen-h200.json), while a leak or a wrong kernel
moves the logits of the positions it touches by about their whole scale."""


def shared_prefix(examples: list[Example]) -> tuple[int, list[int]]:
    """(prefix length, indices of the examples that share it) for a micro-batch's examples; (0, []) when none.

    The group is the examples that begin like the most common opening; the prefix is their longest common one,
    cut so that no loss term reads a logit inside it (a supervised token's predecessor stays in its own example:
    the prefix ends before each example's first supervised position minus one) and every example keeps a token.
    """
    if len(examples) < 2:
        return 0, []
    heads: dict[tuple, list[int]] = {}
    for i, ex in enumerate(examples):
        if len(ex.ids) > MIN_SHARED_PREFIX:
            heads.setdefault(tuple(ex.ids[:MIN_SHARED_PREFIX]), []).append(i)
    group = max(heads.values(), key=len, default=[])
    if len(group) < 2:
        return 0, []
    first = examples[group[0]].ids
    n = min(len(examples[i].ids) for i in group) - 1
    for i in group[1:]:
        ids = examples[i].ids
        k = MIN_SHARED_PREFIX
        while k < n and ids[k] == first[k]:
            k += 1
        n = k
    for i in group:  # labels[t] is predicted from position t-1: positions < n must predict nothing
        labels = examples[i].labels
        n = min(n, next((t for t in range(1, len(labels)) if labels[t] != IGNORE), len(labels)) - 1)
    return (n, group) if n >= MIN_SHARED_PREFIX else (0, [])


def collate_shared(rows: list[Row]) -> dict | None:
    """A micro-batch as one flattened row whose examples share their common prefix (None when they share none).

    Layout: the prefix (positions 0..P-1), then each sharing example's tokens after it (positions P.., as in its
    own copy), then the other examples whole (positions from 0). Keys besides the (1, N) tensors: `cu_seq_lens`
    (segment boundaries, the prefix first), `shared_prefix_len` (P) and `shared_prefix_end` (where the segments
    that attend to the prefix end); for the CUDA form, `key_index` (each segment's key positions in order: the
    prefix's, then its own) and `cu_seq_lens_k` (their boundaries)."""
    import torch

    exs = [ex for row in rows for ex in row]
    n, group = shared_prefix(exs)
    if not n:
        return None
    ids, labels, pos = list(exs[group[0]].ids[:n]), [IGNORE] * n, list(range(n))
    bounds = [0, n]
    members = set(group)
    for i in group:
        ex = exs[i]
        ids += ex.ids[n:]
        labels += ex.labels[n:]
        pos += range(n, len(ex.ids))
        bounds.append(len(ids))
    end = len(ids)
    for i, ex in enumerate(exs):
        if i not in members:
            ids += ex.ids
            labels += ex.labels
            pos += range(len(ex.ids))
            bounds.append(len(ids))
    key_index, key_bounds = [], [0]
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        if n <= start < end:
            key_index += range(n)
        key_index += range(start, stop)
        key_bounds.append(len(key_index))
    return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]), "position_ids": torch.tensor([pos]),
            "cu_seq_lens": torch.tensor(bounds, dtype=torch.int32), "shared_prefix_len": n,
            "shared_prefix_end": end, "key_index": torch.tensor(key_index),
            "cu_seq_lens_k": torch.tensor(key_bounds, dtype=torch.int32)}


def probe_rows(vocab: int) -> list[Row]:
    """The packed batch the isolation checks run: two rows of two seeded random examples (5 + 6, 7 + 3 tokens),
    the second row padded."""
    import torch

    g = torch.Generator().manual_seed(0)
    exs = [Example(ids=torch.randint(3, vocab, (n,), generator=g).tolist(), labels=[0] * n) for n in (5, 6, 7, 3)]
    return [exs[:2], exs[2:]]


def shared_probe_rows(vocab: int) -> list[Row]:
    """Two rows whose examples 0-2 open with the same 9 tokens (supervised after their 11th) and example 3 does
    not: the shared layout's prefix, its sharing segments and an unshared one."""
    import torch

    g = torch.Generator().manual_seed(1)
    head = torch.randint(3, vocab, (9,), generator=g).tolist()
    exs = []
    for n in (4, 7, 5):
        ids = head + torch.randint(3, vocab, (n,), generator=g).tolist()
        exs.append(Example(ids=ids, labels=[IGNORE] * 11 + ids[11:]))
    ids = torch.randint(3, vocab, (6,), generator=g).tolist()
    exs.append(Example(ids=ids, labels=[IGNORE] + ids[1:]))
    return [exs[:2], exs[2:]]


def isolation_error(model, device: str, autocast, batch: dict, exs: list[Example], spans) -> tuple[float, float]:
    """(largest difference, largest logit) between each example's logits in one packed forward of `batch` and its
    forward alone, in eval mode without gradients (the mode is restored, also when a forward raises).
    `spans(logits)` yields (index into `exs`, that example's logits in the packed output)."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast():
            got = model(**model_inputs(model, batch, device, packed=True)).logits
            alone = [model(input_ids=torch.tensor([ex.ids]).to(device), use_cache=False).logits[0].float()
                     for ex in exs]
    finally:
        model.train(was_training)
    diff, scale = 0.0, 0.0
    for i, mine in spans(got):
        diff = max(diff, float((mine.float() - alone[i]).abs().max()))
        scale = max(scale, float(alone[i].abs().max()))
    return diff, scale


def shared_layout_error(model, device: str, autocast, vocab: int) -> float:
    """Largest difference, relative to the logits' scale, between each example's logits in the shared-prefix
    layout (`collate_shared`, the prefix's logits taken as every sharing example's own) and its forward alone."""
    import torch

    rows = shared_probe_rows(vocab)
    exs = [ex for row in rows for ex in row]
    batch = collate_shared(rows)
    n, group = shared_prefix(exs)
    bounds = batch["cu_seq_lens"].tolist()
    order = group + [i for i in range(len(exs)) if i not in group]

    def spans(logits):
        got = logits[0]
        for k, i in enumerate(order):
            span = got[bounds[k + 1]:bounds[k + 2]]
            yield i, (torch.cat((got[:n], span)) if i in group else span)

    diff, scale = isolation_error(model, device, autocast, batch, exs, spans)
    return diff / (scale or 1.0)


RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "mamba", "conv", "recurrent"})
"""`config.layer_types` entries whose token mixer carries state along the row instead of attending by position."""


def has_recurrent_layers(model) -> bool:
    """Whether any decoder layer mixes tokens with a recurrence (then packed rows need varlen boundaries)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    return any(kind in RECURRENT_LAYER_TYPES for kind in (getattr(config, "layer_types", None) or ()))


def model_inputs(model, batch: dict, device: str, *, packed: bool) -> dict:
    """Keyword arguments for `model(...)` (all but `logits_to_keep`) from a collated batch.

    `packed`: some row holds 2+ examples (padding after one example needs no boundary: attention is causal).
    Softmax attention takes the (B, T) rows with per-example position ids. A model with recurrent layers, or one
    set to per-example attention (`mens.train.segment_attention`), given packed rows, gets the batch flattened to
    (1, B*T) with the boundaries its kernels take; logits
    and any (B, T) mask then follow the same row-major order (`mask.reshape(inputs["input_ids"].shape)`).
    """
    from mens.train.segment_attention import uses_segment_attention

    ids, pos = batch["input_ids"], batch["position_ids"]
    kw: dict = {"use_cache": False}
    recurrent = has_recurrent_layers(model)
    if "shared_prefix_len" in batch:  # collate_shared: already one row with its boundaries
        cu, cu_k = batch["cu_seq_lens"], batch["cu_seq_lens_k"]
        kw.update(cu_seq_lens_q=cu.to(device), cu_seq_lens_k=cu_k.to(device),
                  max_length_q=int((cu[1:] - cu[:-1]).max()), max_length_k=int((cu_k[1:] - cu_k[:-1]).max()),
                  shared_prefix_len=batch["shared_prefix_len"], shared_prefix_end=batch["shared_prefix_end"],
                  shared_key_index=batch["key_index"].to(device))
    elif packed and (recurrent or uses_segment_attention(model)):
        import torch
        from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

        ids, pos = ids.reshape(1, -1), pos.reshape(1, -1)
        (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(pos)
        kw.update(cu_seq_lens_q=cu_q.to(device), cu_seq_lens_k=cu_k.to(device), max_length_q=int(max_q),
                  max_length_k=int(max_k))
        if recurrent:
            seq_idx = (torch.cumsum(pos == 0, -1) - 1).to(torch.int32)  # (1, B*T) segment number of each token
            kw.update(seq_idx=seq_idx.to(device))
    kw.update(input_ids=ids.to(device), position_ids=pos.to(device))
    return kw


def token_loss_sum(logits, labels):
    """Sum (not mean) of next-token cross-entropy over supervised positions, in float32. logits: (B, T, V)."""
    import torch.nn.functional as F

    logits = logits[:, :-1].float()
    target = labels[:, 1:].to(logits.device)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def batch_loss_sum(model, rows: list[Row], pad_id: int, device: str, autocast):
    """Sum of token losses of one micro-batch (0-dim tensor with grad) and the batch's supervised-token count.

    Logits are computed only where the next token is supervised (`keep`, a boolean (B, T) mask), a few hundred
    rows at a time (`mens.train.loss`): with a 152k vocabulary the LM head's f32 logits would outweigh the model.
    No attention_mask: packed segments stay apart through their position ids. Where the model shares prefixes
    (`segment_attention.shares_prefix`), the examples' common prefix is computed once (`collate_shared`).
    """
    from mens.train.loss import supervised_loss_sum
    from mens.train.segment_attention import shares_prefix

    batch = (collate_shared(rows) if shares_prefix(model) else None) or collate(rows, pad_id)
    labels = batch["labels"]
    keep = labels.new_zeros(labels.shape, dtype=bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE  # position t predicts token t+1
    target = labels[:, 1:][keep[:, :-1]].to(device)  # (N,)
    inputs = model_inputs(model, batch, device, packed=any(len(row) > 1 for row in rows))
    keep = keep.reshape(inputs["input_ids"].shape)  # (1, B*T) where rows were flattened for recurrent layers
    return supervised_loss_sum(model, inputs, keep.to(device), target, autocast), int(target.numel())

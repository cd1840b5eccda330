"""Packing examples into rows and collating rows into tensors.

Examples in one row never see each other: position ids restart at 0 for every example, and the model is
called without a 2D attention mask, so transformers (>= 4.5x masking_utils) builds a block-diagonal causal
mask from the position ids (flash-attention kernels use the same ids as varlen boundaries). Padding is its
own segment with label -100.
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


def token_loss_sum(logits, labels):
    """Sum (not mean) of next-token cross-entropy over supervised positions, in float32. logits: (B, T, V)."""
    import torch.nn.functional as F

    logits = logits[:, :-1].float()
    target = labels[:, 1:].to(logits.device)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def batch_loss_sum(model, rows: list[Row], pad_id: int, device: str, autocast):
    """Sum of token losses of one micro-batch (0-dim tensor with grad) and the batch's supervised-token count.

    Logits are computed only where the next token is supervised (`logits_to_keep` as a boolean (B, T) mask):
    with a 49k vocabulary the LM head and its f32 logits are a large share of time and memory, and prompt
    positions never need them. No attention_mask: packed segments stay apart through their position ids.
    """
    import torch.nn.functional as F

    batch = collate(rows, pad_id)
    labels = batch["labels"]
    keep = labels.new_zeros(labels.shape, dtype=bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE  # position t predicts token t+1
    target = labels[:, 1:][keep[:, :-1]].to(device)  # (N,)
    with autocast():
        logits = model(input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device),
                       use_cache=False, logits_to_keep=keep.to(device)).logits  # (N, V)
    return F.cross_entropy(logits.float(), target, reduction="sum"), int(target.numel())

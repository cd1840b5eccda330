"""Training data: read train.jsonl (the corpus contract), encode, split off validation, build the batch plan.

The plan is a pure function of (rows, seed, step): optimizer step s covers the global rows
`order(epoch)[i*G:(i+1)*G]` with G = batch_size x grad_accum x world_size, so the data cursor is just s.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

from mens.corpus.records import BadLine, read_pairs
from mens.corpus.units import sha256_text
from mens.errors import DataError
from mens.train.packing import Row, pack_examples
from mens.train.text import Example, chat_for_row, encode_chat

VAL_SEED_XOR = 0xA1B2C3D4  # the validation split draws from its own stream (like the original)
PACK_SEED_XOR = 0x5EED0FF5  # so does the packing order (data.pack_shuffle)


def resolve_data_file(data: str | Path) -> Path:
    """`D/train.jsonl` for a directory, or the .jsonl file itself."""
    p = Path(data)
    if p.is_dir():
        p = p / "train.jsonl"
    if not p.is_file():
        raise DataError(f"--data-dir {data}: no training file at {p}; pass a directory holding train.jsonl "
                        "(made by `mens corpus pairs`) or a .jsonl file")
    return p


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Dataset:
    train: list[Example]
    val: list[Example]
    skipped: dict[str, int] = field(default_factory=dict)
    rows_read: int = 0


def read_examples(path: Path, tokenizer, *, seq_len: int, ce_last_k: int, system_prompt: str | None,
                  min_rating: int, max_per_answer: int = 0) -> tuple[list[Example], dict[str, int], int]:
    """Encode every good row; any bad line is a one-line DataError listing file:line and the reason.

    Rows come from the bounded reader (`read_pairs`): line size, JSON depth, lone surrogates and NUL characters are
    rejected per row, so a hostile row is reported here and never reaches the tokenizer. Bad rows stop the run
    rather than being skipped, because a train file is the output of `mens corpus validate`/`pairs`: a bad row in
    it means the file was edited or truncated, and training on the rest would hide that. The file size is capped
    (MAX_JSONL_FILE_BYTES), a DataError before anything is read.
    """
    bad: list[BadLine] = []
    pairs = []
    skipped: dict[str, int] = {}
    n = 0
    for _, item in read_pairs(path):
        n += 1
        if isinstance(item, BadLine):
            bad.append(item)
            continue
        if item.rating is not None and item.rating < min_rating:
            skipped["rating_below_min"] = skipped.get("rating_below_min", 0) + 1
            continue
        pairs.append(item)
    if bad:  # one line: each bad row's file:line and reason (the first 10)
        shown = "; ".join(str(b) for b in bad[:10])
        more = f"; … and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise DataError(f"{path}: {len(bad)} of {n} lines are not valid train.jsonl records: {shown}{more}. "
                        "Fix or drop them (`mens corpus validate` writes rejects with reasons), then re-run")
    if max_per_answer > 0:
        kept = keep_per_answer(pairs, max_per_answer)
        if len(kept) < len(pairs):
            skipped["same answer as kept rows (max_per_answer)"] = len(pairs) - len(kept)
        pairs = kept
    examples: list[Example] = []
    for item in pairs:
        ex = encode_chat(tokenizer, chat_for_row(item, system_prompt), seq_len=seq_len, ce_last_k=ce_last_k)
        if isinstance(ex, str):
            skipped[ex] = skipped.get(ex, 0) + 1
            continue
        if max(ex.ids) >= len(tokenizer):
            skipped["token id out of vocabulary"] = skipped.get("token id out of vocabulary", 0) + 1
            continue
        examples.append(ex)
    return examples, skipped, n


def keep_per_answer(pairs: list, limit: int) -> list:
    """At most `limit` rows per distinct answer (the last assistant turn), in file order.

    Which rows of a group stay depends only on the answer text: the group's rows are taken in file order from
    index sha256(answer) mod group size, wrapping round. So the choice is the same for every seed and on resume,
    and it does not favour the first phrasing a generator happens to write.
    """
    groups: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        groups.setdefault(pair.chat()[-1]["content"], []).append(i)
    keep: set[int] = set()
    for answer, idx in groups.items():
        start = int(sha256_text(answer), 16) % len(idx)
        keep.update((idx[start:] + idx[:start])[:limit])
    return [p for i, p in enumerate(pairs) if i in keep]


def split_validation(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Hold out round(n*fraction) examples (at least 1 when fraction > 0, at most n/4), chosen by seed."""
    import torch

    n = len(examples)
    n_val = min(n // 4, max(1, round(n * fraction))) if fraction > 0 and n >= 4 else 0
    if n_val == 0:
        return examples, []
    g = torch.Generator().manual_seed(seed ^ VAL_SEED_XOR)
    perm = torch.randperm(n, generator=g).tolist()
    val_idx = set(perm[:n_val])
    return [e for i, e in enumerate(examples) if i not in val_idx], [examples[i] for i in sorted(val_idx)]


def packing_order(examples: list[Example], seed: int) -> list[Example]:
    """`examples` in a random order drawn from `seed` (its own stream, as the validation split's), for packing."""
    import torch

    g = torch.Generator().manual_seed(seed ^ PACK_SEED_XOR)
    return [examples[i] for i in torch.randperm(len(examples), generator=g).tolist()]


def build_rows(examples: list[Example], *, pack: bool, seq_len: int) -> list[Row]:
    return pack_examples(examples, seq_len) if pack else [[e] for e in examples]


@dataclass
class BatchPlan:
    """Which rows each optimizer step sees. Deterministic in (n_rows, seed, step), and in `second_pass` where a run
    set it (`hardest_first`; checkpoints keep it)."""

    n_rows: int
    global_batch: int
    seed: int
    total_steps: int
    second_pass: list[int] | None = None
    """The second pass's row order, where `data.second_pass` chose it from the first pass's losses."""

    @property
    def steps_per_epoch(self) -> int:
        return max(1, math.ceil(self.n_rows / self.global_batch))

    def epoch_order(self, epoch: int) -> list[int]:
        import torch

        if epoch == 1 and self.second_pass is not None:
            return self.second_pass
        g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        return torch.randperm(self.n_rows, generator=g).tolist()

    def second_pass_reach(self, total_steps: int) -> int:
        """Rows the second pass trains in a run of `total_steps` (not capped at n_rows)."""
        return (total_steps - self.steps_per_epoch) * self.global_batch

    def rows_for_step(self, step: int) -> list[int]:
        """Global row indices of optimizer step `step` (0-based)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        order = self.epoch_order(epoch)
        return order[i * self.global_batch:(i + 1) * self.global_batch]


LOSS_WINDOW = 10
"""Steps either side of a first-pass step whose losses give the median it is measured against (`hardest_first`)."""


def hardest_first(plan: BatchPlan, step_losses: list[float], total_steps: int) -> list[int] | None:
    """The second pass's order for a run that ends inside it: the rows the first pass found hardest, then the rest.

    A row's hardness is the loss of the first-pass step that trained it, over the median loss of the steps around
    that one (LOSS_WINDOW either side, fewer near the ends of the pass so that the step stays in the middle): the
    loss falls as the run learns, and a row is compared with the rows the model met at about the same point. A
    window that reached further on one side would measure a step against a later (lower) or earlier (higher) loss.
    The loss was measured before the step's update, on rows the model had not seen. As many rows as the second
    pass will reach (`BatchPlan.second_pass_reach`), the hardest, come first, and the rest after
    them (where a re-fit lengthens the run), each group in the pass's own seeded random order. A run that reaches
    the end of the second pass (or never starts it) keeps the random order: None.
    """
    spe, reach = plan.steps_per_epoch, plan.second_pass_reach(total_steps)
    if reach <= 0 or reach >= plan.n_rows or len(step_losses) < spe:
        return None
    first = plan.epoch_order(0)
    score = [0.0] * plan.n_rows
    for s in range(spe):
        w = min(LOSS_WINDOW, s, spe - 1 - s)
        around = sorted(step_losses[s - w:s + w + 1])
        median = around[len(around) // 2]
        for row in first[s * plan.global_batch:(s + 1) * plan.global_batch]:
            score[row] = step_losses[s] / median if median > 0 else 1.0
    shuffled = BatchPlan(plan.n_rows, plan.global_batch, plan.seed, plan.total_steps).epoch_order(1)
    rank = {row: i for i, row in enumerate(shuffled)}
    by_hardness = sorted(range(plan.n_rows), key=lambda row: (-score[row], rank[row]))
    hard = set(by_hardness[:reach])
    return [row for row in shuffled if row in hard] + [row for row in shuffled if row not in hard]


def plan_steps(n_rows: int, global_batch: int, *, epochs: float, max_steps: int, seed: int) -> BatchPlan:
    plan = BatchPlan(n_rows, global_batch, seed, 0)
    plan.total_steps = max_steps if max_steps > 0 else max(1, math.ceil(epochs * plan.steps_per_epoch))
    return plan

"""The chunked loss (mens.train.loss): same loss and LoRA gradients as full logits on llama/qwen2/gemma3/cohere/
granite shapes, the plain fallback where the head cannot be split, and a lower peak memory (the peak RSS of a child
process, /proc/self/status VmHWM: tracemalloc does not see torch's allocations)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mens.train import loss
from mens.train.packing import batch_loss_sum, collate, pack_examples, token_loss_sum

ARCHS = {  # model_type -> (config class, model class, what comes after the head); transformers' names
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    {"final_logit_softcapping": 0.5, "head_dim": 16}),  # a cap that bends these tiny logits
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.25}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 4.0}),
}


def tiny_lm(arch: str, vocab: int = 300, lora: bool = True):
    import transformers

    cfg_name, model_name, extra = ARCHS[arch]
    cfg_cls, model_cls = getattr(transformers, cfg_name), getattr(transformers, model_name)
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0, **extra)
    model = model_cls(cfg)
    if not lora:
        return model
    from mens.model.lora import attach_lora

    model = attach_lora(model, r=4, alpha=8, dropout=0.0)
    for n, p in model.named_parameters():  # a non-zero B, so every LoRA gradient is non-trivial
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    return model


def batch(vocab: int = 300, seed: int = 1):
    """Two packed rows: prompts unsupervised, padding at the end of the second."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (2, 48), generator=g)
    labels = ids.clone()
    labels[:, :9] = -100
    labels[0, 20:26] = -100
    labels[1, 40:] = -100
    pos = torch.cat([torch.arange(20), torch.arange(28)]).expand(2, 48).clone()
    return ids, labels, pos


def new_loss(model, ids, labels, pos, rows=7):
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != -100
    inputs = {"input_ids": ids, "position_ids": pos, "use_cache": False}
    return loss.supervised_loss_sum(model, inputs, keep, labels[:, 1:][keep[:, :-1]], contextlib.nullcontext,
                                    rows=rows)


def lora_grads(model) -> dict:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


def compare_with_full_logits(model, path: str, monkeypatch) -> tuple[float, float]:
    """Loss and gradients of the new loss vs CE over the model's full (B, T, V) logits; returns the relative
    loss difference and the largest gradient difference relative to the largest gradient."""
    if path == "checkpoint":  # the generic path (heads with adapters, 4-bit heads, wrappers)
        monkeypatch.setattr(loss, "_plain_linear", lambda head: False)
    head = model.get_output_embeddings()
    ids, labels, pos = batch()
    ref = token_loss_sum(model(input_ids=ids, position_ids=pos, use_cache=False).logits, labels)
    ref.backward()
    ref_grads = lora_grads(model)
    rows_seen: list[int] = []
    hook = head.register_forward_hook(lambda m, a, out: rows_seen.append(out.reshape(-1, out.shape[-1]).shape[0]))
    got = new_loss(model, ids, labels, pos)
    got.backward()
    hook.remove()
    grads = lora_grads(model)
    assert loss._CHECKED[head] is True  # the split path ran, not the fallback
    if path == "checkpoint":  # the head module never saw more than one chunk, recomputation included
        assert max(rows_seen) <= 7 and len(rows_seen) > 3, rows_seen
    else:  # only the one-row check ran through the module (in the forward, then alone); chunks use F.linear
        assert rows_seen == [1, 1], rows_seen
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    diff = max((grads[k] - ref_grads[k]).abs().max().item() for k in grads)
    scale = max(g.abs().max().item() for g in ref_grads.values())
    return abs(got.item() - ref.item()) / abs(ref.item()), diff / max(1.0, scale)


@pytest.mark.parametrize("path", ["linear", "checkpoint"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_chunked_loss_matches_full_logits_in_value_and_lora_grads(arch, path, monkeypatch):
    rel_loss, rel_grad = compare_with_full_logits(tiny_lm(arch), path, monkeypatch)
    print(f"{arch}/{path}: loss {rel_loss:.1e}, LoRA grads {rel_grad:.1e} (relative)")
    assert rel_loss <= 1e-5 and rel_grad <= 1e-5


@pytest.mark.parametrize("path", ["linear", "checkpoint"])
@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "biased-head"])
def test_chunked_loss_matches_full_logits_for_every_weight(arch, path, monkeypatch):
    """Full fine-tuning: the head's weight (tied to the embeddings) and bias get their gradients too."""
    model = tiny_lm("llama" if arch == "biased-head" else arch, lora=False)
    if arch == "biased-head":
        model.lm_head = torch.nn.Linear(32, 300, bias=True)
    rel_loss, rel_grad = compare_with_full_logits(model, path, monkeypatch)
    assert rel_loss <= 1e-5 and rel_grad <= 1e-5


def test_bf16_autocast_matches_plain_path():
    """Under bf16 autocast the chunks' matmuls run in bf16 like the model's own head: same loss, same gradients to
    bf16 accuracy (the plain path here is mens' previous loss: the model's logits at the kept positions)."""
    model = tiny_lm("gemma3_text")
    ids, labels, pos = batch()
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != -100
    inputs, target = {"input_ids": ids, "position_ids": pos, "use_cache": False}, labels[:, 1:][keep[:, :-1]]
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    ref = loss.plain_loss_sum(model, inputs, keep, target, bf16)
    ref.backward()
    ref_grads = lora_grads(model)
    got = loss.supervised_loss_sum(model, inputs, keep, target, bf16, rows=7)
    got.backward()
    grads = lora_grads(model)
    assert loss._CHECKED[model.get_output_embeddings()] is True
    rel = max((grads[k] - ref_grads[k]).abs().max().item() for k in grads) / max(
        g.abs().max().item() for g in ref_grads.values())
    print(f"bf16: loss {got.item():.4f} vs {ref.item():.4f}, grads {rel:.1e} (relative)")
    assert abs(got.item() - ref.item()) <= 1e-3 * ref.item() and rel <= 2e-2


def test_softcap_and_scale_matter_here():
    """The post-head operations change these tiny models' losses, so the test above would catch dropping them."""
    for arch in ("gemma3_text", "cohere", "granite"):
        model = tiny_lm(arch, lora=False)
        ids, labels, pos = batch()
        with torch.no_grad():
            h = model.model(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
            raw = token_loss_sum(model.lm_head(h), labels).item()
            real = token_loss_sum(model(input_ids=ids, position_ids=pos, use_cache=False).logits, labels).item()
        assert abs(raw - real) > 1e-2 * abs(real), arch
        assert loss.head_math(model) != loss.HeadMath()


def test_eval_path_and_batch_loss_sum_agree_with_full_logits(tiny_qwen_dir):
    from train_tiny import build_tokenizer, vox_rows

    from mens.corpus.records import TrainPair
    from mens.model.load import load_base
    from mens.train.text import chat_for_row, encode_chat

    tok = build_tokenizer()
    examples = [encode_chat(tok, chat_for_row(TrainPair(**r), "SYS"), seq_len=96) for r in vox_rows(6)]
    model = load_base(tiny_qwen_dir, backend="lora", device="cpu").eval()
    rows = pack_examples(examples, 256)
    with torch.no_grad():
        b = collate(rows, 0)
        full = token_loss_sum(model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits,
                              b["labels"])
        part, n = batch_loss_sum(model, rows, 0, "cpu", contextlib.nullcontext)
    assert loss._CHECKED[model.get_output_embeddings()] is True
    assert n == sum(ex.n_supervised for ex in examples) and not part.requires_grad
    assert abs(part.item() - full.item()) <= 1e-5 * full.item()


class ScaledAfterHead(torch.nn.Module):
    """A causal LM that does something to its logits that no config field names (x 3): the split must not be used."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits = out.logits * 3.0
        return out


class HeadAsFunction(torch.nn.Module):
    """A causal LM that applies its head's weight with F.linear: the head module never runs, the hook never fires."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_output_embeddings(self):
        return self.inner.lm_head

    def forward(self, input_ids, position_ids, logits_to_keep, use_cache=False):
        h = self.inner.model(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        from transformers.modeling_outputs import CausalLMOutput

        return CausalLMOutput(logits=torch.nn.functional.linear(h, self.inner.lm_head.weight))  # (B, T, V)


@pytest.mark.parametrize("wrap", [ScaledAfterHead, HeadAsFunction])
def test_unsplittable_models_fall_back_to_full_logits(wrap, caplog):
    inner = tiny_lm("llama", lora=False)
    model = wrap(inner)
    ids, labels, pos = batch()
    ref = token_loss_sum(model(input_ids=ids, position_ids=pos, logits_to_keep=0, use_cache=False).logits, labels)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for _ in range(2):  # the second call goes straight to the plain path
        got = new_loss(model, ids, labels, pos)
        assert loss._CHECKED[model.get_output_embeddings()] is False
        assert abs(got.item() - ref.item()) <= 1e-5 * ref.item()
    got.backward()
    diff = max((p.grad - ref_grads[n]).abs().max().item() for n, p in model.named_parameters())
    assert diff <= 1e-5 * max(g.abs().max().item() for g in ref_grads.values())
    assert "chunked loss disabled" in caplog.text


def test_no_supervised_token_gives_a_zero_that_backpropagates():
    model = tiny_lm("llama")
    ids, labels, pos = batch()
    labels[:] = -100
    got = new_loss(model, ids, labels, pos)
    got.backward()
    assert got.item() == 0.0 and got.requires_grad


class FakeLigerLoss:
    """Liger's `LigerFusedLinearCrossEntropyLoss` contract, in plain torch: (weight, input, target, bias)."""

    def __init__(self, ignore_index=-100, reduction="mean", softcap=None):
        self.ignore_index, self.reduction, self.softcap = ignore_index, reduction, softcap

    def __call__(self, weight, x, target, bias=None):
        z = torch.nn.functional.linear(x, weight, bias).float()
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return torch.nn.functional.cross_entropy(z, target, ignore_index=self.ignore_index, reduction=self.reduction)


@pytest.mark.parametrize("arch", ["gemma3_text", "cohere"])
def test_fused_path_passes_softcap_and_scale_to_liger(arch, monkeypatch):
    import types

    fake = types.ModuleType("liger_kernel.transformers")
    fake.LigerFusedLinearCrossEntropyLoss = FakeLigerLoss
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    model = tiny_lm(arch, lora=False)
    head = model.get_output_embeddings()
    h = torch.randn(10, 32)
    target = torch.randint(0, 300, (10,))
    assert not loss._fused_usable(head, h, loss.head_math(model))  # importable, but this is not a CUDA tensor
    ref = loss.chunked_loss_sum(head, h, target, loss.head_math(model), contextlib.nullcontext, rows=4)
    got = loss._fused_loss_sum(head, h, target, loss.head_math(model), contextlib.nullcontext)
    assert abs(got.item() - ref.item()) <= 1e-5 * ref.item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_liger_on_cuda_matches_chunked(monkeypatch):
    pytest.importorskip("liger_kernel")
    model = tiny_lm("gemma3_text", lora=False).cuda()
    head = model.get_output_embeddings()
    h, target = torch.randn(64, 32, device="cuda"), torch.randint(0, 300, (64,), device="cuda")
    math = loss.head_math(model)
    assert loss._fused_usable(head, h, math)
    monkeypatch.setattr(loss, "FUSED_CE", "off")  # the benchmark's A/B: mens' own chunks
    assert not loss._fused_usable(head, h, math)
    monkeypatch.setattr(loss, "FUSED_CE", "auto")
    ref = loss.chunked_loss_sum(head, h, target, math, contextlib.nullcontext, rows=16)
    assert abs(loss._fused_loss_sum(head, h, target, math, contextlib.nullcontext).item() - ref.item()) < 1e-3


class TorchOnlyLM(torch.nn.Module):
    """A causal LM in plain torch with transformers' calling convention (the memory child skips importing
    transformers, ~3 s): embeddings -> one MLP block -> tied head; `logits_to_keep` as a boolean (B, T) mask."""

    def __init__(self, vocab: int, hidden: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.block = torch.nn.Sequential(torch.nn.Linear(hidden, 2 * hidden), torch.nn.GELU(),
                                         torch.nn.Linear(2 * hidden, hidden))
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.embed.weight
        self.config = type("Config", (), {})()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, position_ids=None, use_cache=False, logits_to_keep=None):
        h = self.embed(input_ids)
        h = h + self.block(h)
        return type("Out", (), {"logits": self.lm_head(h[logits_to_keep])})()


def _memory_model(kind: str, vocab: int, seq_len: int):
    torch.manual_seed(0)
    if kind == "torch":
        model = TorchOnlyLM(vocab)
    else:
        import transformers

        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=seq_len, tie_word_embeddings=True)
        model = transformers.LlamaForCausalLM(cfg)
    model.get_output_embeddings().weight.requires_grad_(False)  # frozen (tied) embeddings and head, as with LoRA
    return model


def _status_mb(field: str) -> float:
    """VmRSS / VmHWM of this process in MB. VmHWM is this process image's own peak: ru_maxrss would also count
    the pytest process this child was forked from (Linux keeps it across execve)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"/proc/self/status has no {field}")


def peak_rss_child(kind: str, variants: str, vocab: int, batch_size: int, seq_len: int, rows: int) -> None:
    """Child process: forward + backward with each variant in turn (comma-separated); prints, per variant, the RSS
    just before it and the peak RSS while it ran (reset before it), in MB. kind: "torch" (TorchOnlyLM) or "llama"."""
    torch.set_num_threads(1)
    model = _memory_model(kind, vocab, seq_len)
    ids = torch.randint(0, vocab, (batch_size, seq_len))
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[:, -1] = False
    target = torch.randint(0, vocab, (int(keep.sum()),))
    inputs = {"input_ids": ids, "position_ids": torch.arange(seq_len).expand(batch_size, seq_len), "use_cache": False}
    fns = {"plain": lambda i, k, t: loss.plain_loss_sum(model, i, k, t, contextlib.nullcontext),
           "chunked": lambda i, k, t: loss.supervised_loss_sum(model, i, k, t, contextlib.nullcontext,
                                                               rows=rows or None)}
    out = {}
    for variant in variants.split(","):
        small = keep[:1, :8]  # one-time allocations (kernels, thread pools) before measuring
        fns[variant]({k: v[:1, :8] for k, v in inputs.items() if k != "use_cache"}, small,
                     target[:int(small.sum())]).backward()
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
        before = _status_mb("VmRSS")
        value = fns[variant](inputs, keep, target)
        value.backward()
        out[variant] = {"before_mb": before, "peak_mb": _status_mb("VmHWM"), "loss": value.item()}
        model.zero_grad(set_to_none=True)
        del value
    print(json.dumps(out))


def measure(kind: str, variants: str, vocab: int, batch_size: int, seq_len: int, rows: int = 0) -> dict:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from test_loss import peak_rss_child; "
            "peak_rss_child(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:]))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), kind, variants, str(vocab),
                           str(batch_size), str(seq_len), str(rows)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_chunked_loss_peak_memory_small_vocab():
    """A torch-only LM, 16k vocabulary, 2 x 512 tokens, chunks of 64 rows, both in one child: each variant's peak
    above the RSS just before it (the loss's own memory)."""
    m = measure("torch", "chunked,plain", 16384, 2, 512, rows=64)
    grow = {k: v["peak_mb"] - v["before_mb"] for k, v in m.items()}
    print(f"loss memory above the model: plain {grow['plain']:.0f} MB, chunked {grow['chunked']:.0f} MB")
    assert abs(m["plain"]["loss"] - m["chunked"]["loss"]) <= 1e-5 * m["plain"]["loss"]
    assert grow["chunked"] <= 0.3 * grow["plain"], m


@pytest.mark.slow
def test_chunked_loss_peak_memory_qwen_vocab():
    """A 1-layer llama with Qwen's 151,936-token vocabulary, hidden 64, 4 x 2048 supervised tokens, default chunks:
    the whole process's peak RSS (model, torch and all), one child per variant. The plain one needs ~15 GB free."""
    batch_size = int(os.environ.get("MENS_LOSS_MEMORY_BATCH", "4"))  # 1 on a machine without ~15 GB free
    plain = measure("llama", "plain", 151936, batch_size, 2048)["plain"]
    chunked = measure("llama", "chunked", 151936, batch_size, 2048)["chunked"]
    print(f"peak RSS: plain {plain['peak_mb']:.0f} MB, chunked {chunked['peak_mb']:.0f} MB "
          f"({chunked['peak_mb'] / plain['peak_mb']:.2f}x)")
    assert abs(plain["loss"] - chunked["loss"]) <= 1e-5 * plain["loss"]
    assert chunked["peak_mb"] <= 0.3 * plain["peak_mb"]

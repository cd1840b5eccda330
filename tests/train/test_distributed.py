"""torchrun support: every collective gets a tensor on a device its backend serves, under a real 2-process group,
and `torchrun --nproc_per_node 2` on CPU (gloo) matches one process with the same global batch.

Run as a script (`torchrun --nproc_per_node 2 tests/train/test_distributed.py`) it is the worker of
`test_helpers_under_torchrun_put_every_tensor_where_its_backend_serves`: torch only, no transformers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # train_tiny, also when run as a torchrun script

from mens.train.distributed import CUDA_BACKEND, Dist, backend_for, served_devices  # noqa: E402
from mens.train.fsdp import torch_sharding_problem  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
               "reduce_scatter_single", "broadcast", "reduce", "gather", "scatter", "all_to_all_single", "send", "recv",
               "isend", "irecv")  # those a torch version lacks are skipped


def test_backend_strings_map_devices():
    assert backend_for("cuda") == CUDA_BACKEND == "cpu:gloo,cuda:nccl" and backend_for("cpu") == "gloo"
    assert served_devices("cpu:gloo,cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}
    assert served_devices("nccl") == {"cuda": "nccl"}
    assert Dist(rank=1, world=2, local_rank=1, backends={"cuda": "nccl"}).scalar_device == "cuda:1"
    assert Dist(rank=1, world=2, local_rank=1, backends=served_devices(CUDA_BACKEND)).scalar_device == "cpu"
    assert Dist().scalar_device == "cpu"


def check_devices(record: list, setter=setattr):
    """Wrap torch.distributed's collectives so that each one first checks that every tensor it is handed lies on a
    device type the group's backend serves (from `dist.get_backend_config(group)`); a violation is recorded and
    raised before the real collective runs. Returns the originals, to unwrap."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    def tensors(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, list | tuple):
            for y in x:
                yield from tensors(y)

    def wrap(name, real):
        def checked(*args, **kwargs):
            group = kwargs.get("group") or next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
            served = served_devices(dist.get_backend_config(group))
            for t in tensors([*args, *kwargs.values()]):
                if t.device.type not in served:
                    record.append(f"{name}: tensor on {t.device} but the group serves {served}")
                    raise RuntimeError(record[-1])
            record.append(f"{name}: ok on {sorted({t.device.type for t in tensors([*args, *kwargs.values()])})}")
            return real(*args, **kwargs)

        return checked

    originals = {}
    for name in COLLECTIVES:
        real = getattr(dist, name, None) or getattr(c10d, name, None)
        if real is None:
            continue
        originals[name] = real
        wrapped = wrap(name, real)
        setter(dist, name, wrapped)  # what FSDP2 calls (`dist.all_gather_single`, ...)
        if hasattr(c10d, name):
            setter(c10d, name, wrapped)  # what all_gather_object calls inside c10d
    return originals


class Block(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up, self.down = torch.nn.Linear(hidden, 2 * hidden), torch.nn.Linear(2 * hidden, hidden)

    def forward(self, h):
        return h + self.down(self.up(h).relu())


class TinyLM(torch.nn.Module):
    """Transformers' calling convention in plain torch: `logits_to_keep` a boolean (B, T) mask, a tied head."""

    _no_split_modules = ["Block"]

    def __init__(self, vocab=97, hidden=16):
        super().__init__()
        self.embed, self.blocks = torch.nn.Embedding(vocab, hidden), torch.nn.ModuleList([Block(hidden), Block(hidden)])
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.config = type("Config", (), {"final_logit_softcapping": 5.0})()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, position_ids=None, use_cache=False, logits_to_keep=None):
        h = self.embed(input_ids)
        for b in self.blocks:
            h = b(h)
        logits = self.lm_head(h[logits_to_keep])
        return type("Out", (), {"logits": 5.0 * (logits / 5.0).tanh()})()


def _tiny_loss(model, seed: int):
    import contextlib

    from mens.train.loss import supervised_loss_sum

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (2, 24), generator=g)
    keep = torch.rand(2, 24, generator=g) > 0.3
    target = torch.randint(0, 97, (int(keep.sum()),), generator=g)
    return supervised_loss_sum(model, {"input_ids": ids, "use_cache": False}, keep, target, contextlib.nullcontext,
                               rows=5)


def worker(out_dir: str) -> None:
    """Under torchrun: a "cpu:gloo" group, every helper, FSDP2 with the chunked loss; results to out_dir/rank.json."""
    import torch.distributed as dist

    from mens.train import distributed, fsdp
    from mens.train.loss import _CHECKED

    dist.init_process_group("cpu:gloo")  # device:backend form, as on CUDA ("cpu:gloo,cuda:nccl")
    d = distributed.setup("cpu")
    record: list[str] = []
    check_devices(record)
    sums = distributed.all_sum(d, [1.0 + d.rank, 2.0**40 + 1])
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.full((3,), float(d.rank + 1))
    distributed.all_sum_grads(d, [p])
    objects = distributed.gather_objects(d, {"rank": d.rank, "rng": torch.get_rng_state()[:4]})
    distributed.barrier(d)
    try:  # the check itself: a tensor on a device this group does not serve must be refused
        dist.all_reduce(torch.zeros(1, device="meta"))
        refused = False
    except RuntimeError:
        refused = True
    record.pop()
    torch.manual_seed(0)
    replica, model = TinyLM(), TinyLM()
    model.load_state_dict(replica.state_dict())
    fsdp.shard_model(model, "cpu")
    replica_loss = _tiny_loss(replica, seed=d.rank)  # this rank's batch on an unsharded replica
    replica_loss.backward()
    loss = _tiny_loss(model, seed=d.rank)
    loss.backward()
    local = {n: q.grad.clone() for n, q in replica.named_parameters()}
    for n in local:  # the replicas' gradients summed over ranks = what FSDP's reduce-scatter must give
        dist.all_reduce(local[n])
    sharded = {n: q.grad.full_tensor() for n, q in model.named_parameters()}
    diff = max((sharded[n] - local[n]).abs().max().item() for n in local)
    Path(out_dir, f"{d.rank}.json").write_text(json.dumps({
        "backends": d.backends, "sums": sums, "grad": p.grad.tolist(), "objects": [o["rank"] for o in objects],
        "refused": refused, "record": record, "fsdp_grad_diff": diff,
        "loss_diff": abs(loss.item() - replica_loss.item()), "split": _CHECKED.get(model.get_output_embeddings())}))
    distributed.teardown(d)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_helpers_hand_collectives_tensors_their_backend_serves(monkeypatch):
    """In this process: a one-rank "cpu:gloo" group, the helpers told there are 2 ranks (so they do call the
    collectives), every collective checked; a tensor on a device the group does not serve is refused."""
    import torch.distributed as dist

    from mens.train import distributed

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("cpu:gloo", store=store, rank=0, world_size=1)
    try:
        record: list[str] = []
        check_devices(record, monkeypatch.setattr)
        d = Dist(rank=0, world=2, backends=served_devices(dist.get_backend_config()))
        assert d.backends == {"cpu": "gloo"} and d.scalar_device == "cpu"
        assert distributed.all_sum(d, [1.5, 2.0**40 + 1]) == [1.5, 2.0**40 + 1]
        p = torch.nn.Parameter(torch.zeros(2))
        p.grad = torch.ones(2)
        distributed.all_sum_grads(d, [p, torch.nn.Parameter(torch.zeros(1))])  # the second has no grad: zeros
        assert p.grad.tolist() == [1.0, 1.0]
        assert [line.split(":")[0] for line in record] == ["all_reduce", "all_reduce"], record
        with pytest.raises(RuntimeError, match="tensor on meta but the group serves"):
            dist.all_reduce(torch.zeros(1, device="meta"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(torch_sharding_problem() is not None, reason=str(torch_sharding_problem()))
def test_helpers_under_torchrun_put_every_tensor_where_its_backend_serves(tmp_path):
    """Two processes (10-33 s here on 2 shared cores: three processes import torch): the helpers, object
    gathering and FSDP2's own collectives with the chunked loss, all device-checked."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), __file__, str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["backends"] == {"cpu": "gloo"}
        assert r["sums"] == [3.0, 2.0**41 + 2]  # float64: 2^41 + 2 is exact
        assert r["grad"] == [3.0, 3.0, 3.0] and r["objects"] == [0, 1]
        assert r["refused"]  # the check can fail
        assert not [line for line in r["record"] if "but the group serves" in line]
        seen = {line.split(":")[0] for line in r["record"]}
        assert {"all_reduce", "all_gather"} <= seen, seen  # the helpers' own (all_gather: inside all_gather_object)
        assert seen & {"all_gather_single", "all_gather_into_tensor"}, seen  # FSDP2's unshard
        assert seen & {"reduce_scatter_single", "reduce_scatter_tensor"}, seen  # FSDP2's gradient reduction
        assert r["split"] is True  # the chunked loss ran on the sharded model (the LM head used after forward)
        assert r["fsdp_grad_diff"] < 1e-5 and r["loss_diff"] < 1e-4, r
    print("collectives checked on rank 0:", len(ranks[0]["record"]))


@pytest.mark.slow
def test_torchrun_two_processes_match_single(data_dir, tmp_path, tiny_model_dir):
    from safetensors.torch import load_file
    from train_tiny import tiny_config

    from mens.train.run import run_training

    single = tmp_path / "single"
    run_training(tiny_config(data_dir, single, tiny_model_dir, max_steps=4, batch_size=4, grad_accum=1,
                             save_every=2, eval_every=2, preset="cpu", warmup_steps=20, epochs=2.0))
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()),
           "-m", "mens", "train", "--data-dir", str(data_dir), "--output-dir", str(out), "--model", str(tiny_model_dir),
           "--backend", "lora", "--device", "cpu", "--max-steps", "4", "--batch-size", "2", "--grad-accum", "1",
           "--save-every", "2", "--eval-every", "2", "--lora-dropout", "0", "--lr", "1e-2", "--seq-len", "96",
           "--rank", "4", "--alpha", "8", "--val-fraction", "0.1", "--min-examples", "10", "--threads", "1",
           "--system-prompt", "You write Vox.", "--preset", "cpu", "--autocast", "off", "--lora-plus-ratio", "1"]
    done = subprocess.run(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    a = load_file(str(single / "adapter_model.safetensors"))
    b = load_file(str(out / "adapter_model.safetensors"))
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"torchrun x2 vs single: max abs adapter diff {diff:.2e}")
    assert diff < 1e-5, diff
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4


if __name__ == "__main__":
    worker(sys.argv[1])

"""Checkpoints are tensors + JSON with checksums: a pickle placed in any checkpoint file is never executed; every
file truncated, zeroed, scrambled or replaced makes resume fall back to the previous good checkpoint with a one-line
reason (or a one-line error when none is left); a NaN step is never saved; a full disk leaves the previous checkpoint
intact and the run resumable."""

from __future__ import annotations

import errno
import hashlib
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from ckpt_tiny import CKPT_FILES, assert_same_adapter, config, live_objects, resumed_from
from train_tiny import vox_rows, write_jsonl

from mens.errors import DataError, ModelError
from mens.train import atomic
from mens.train.checkpoint import list_checkpoints, newest_good, verify_files
from mens.train.run import run_training


class Boom:
    """Unpickling this creates `marker`: proof that a loader executed code from a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def ref(tmp_path_factory, tiny_model_dir):
    """An uninterrupted run: its adapter is what every resumed run must reproduce byte for byte."""
    root = tmp_path_factory.mktemp("ckpt-ref")
    data = root / "data"
    data.mkdir()
    write_jsonl(data / "train.jsonl", vox_rows(40))
    run_training(config(data, root / "run", tiny_model_dir))
    assert [p.name for p in list_checkpoints(root / "run")] == ["step-2", "step-4"]
    return root


@pytest.fixture(scope="module")
def objs(tiny_model_dir):
    return live_objects(tiny_model_dir)


def _copy(ref: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ref / "run", tmp_path / "run"))


def _corrupt(path: Path, kind: str, marker: Path) -> None:
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "zeroed":
        path.write_bytes(bytes(len(data)))
    elif kind == "scrambled":  # 16 bytes in the middle permuted: the size stays, the content does not
        mid, raw = len(data) // 2, bytearray(data)
        chunk = raw[mid:mid + 16]
        random.Random(0).shuffle(chunk)
        raw[mid:mid + 16] = chunk if chunk != raw[mid:mid + 16] else bytes(b ^ 0xFF for b in chunk)
        path.write_bytes(bytes(raw))
    elif kind == "pickle":
        torch.save({"state": Boom(marker)}, path)
    else:
        raise AssertionError(kind)


def _rehash(ckpt: Path) -> None:
    """Rewrite checksums.json to match the files as they are now (damage the checksum cannot reveal)."""
    sums = json.loads((ckpt / "checksums.json").read_text())
    for name in sums["files"]:
        data = (ckpt / name).read_bytes()
        sums["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (ckpt / "checksums.json").write_text(json.dumps(sums))


@pytest.mark.parametrize("kind", ["truncated", "zeroed", "scrambled", "pickle"])
def test_any_damaged_checkpoint_file_falls_back_to_previous(kind, ref, objs, tmp_path):
    marker = tmp_path / "pwned"
    for name in CKPT_FILES:
        run = _copy(ref, tmp_path / name)
        _corrupt(run / "checkpoints/step-4" / name, kind, marker)
        loaded, skipped = newest_good(run, **objs)
        assert loaded is not None and loaded.path.name == "step-2", (name, skipped)
        assert len(skipped) == 1 and skipped[0].startswith("checkpoints/step-4: ") and "\n" not in skipped[0]
        assert name in skipped[0] or name == "checksums.json", skipped  # the reason names the damaged file
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["truncated", "zeroed", "pickle"])
def test_damage_behind_matching_checksums_is_still_refused(kind, ref, objs, tmp_path):
    """Even with checksums.json rewritten to match, a file that does not load is refused, never half-loaded."""
    marker = tmp_path / "pwned"
    for name in CKPT_FILES[1:-1]:  # adapter_config.json is not read on resume; checksums.json is the checksum
        run = _copy(ref, tmp_path / name)
        _corrupt(run / "checkpoints/step-4" / name, kind, marker)
        _rehash(run / "checkpoints/step-4")
        loaded, skipped = newest_good(run, **objs)
        assert loaded.path.name == "step-2" and len(skipped) == 1 and name in skipped[0], (name, skipped)
    assert not marker.exists()


def test_old_pickled_checkpoint_is_refused_in_one_line_never_unpickled(ref, tiny_model_dir, tmp_path, capsys):
    """A run directory from an older mens (optimizer.pt, scheduler.pt, rng.pt), here crafted to run code."""
    from mens.cli.main import main

    marker = tmp_path / "pwned"
    run = _copy(ref, tmp_path)
    (run / "adapter_model.safetensors").unlink()
    for ckpt in list_checkpoints(run):
        for f in ("optimizer.safetensors", "scheduler.json", "rng.safetensors", "checksums.json"):
            (ckpt / f).unlink()
        for f in ("optimizer.pt", "scheduler.pt", "rng.pt"):
            torch.save({"ranks": [Boom(marker)], "state": Boom(marker)}, ckpt / f)
    args = ["train", str(run / "config.yaml"), "--output-dir", str(run), "--resume"]  # the run's own settings
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    line = [x for x in err.splitlines() if "--resume: no usable checkpoint" in x]
    assert len(line) == 1 and "older mens" in line[0] and "mens version that wrote them" in line[0], err[-2000:]
    assert not marker.exists()
    assert not (run / "adapter_model.safetensors").exists()


def test_fallback_resume_prints_reason_and_matches_uninterrupted(ref, tiny_model_dir, tmp_path, capsys):
    run = _copy(ref, tmp_path)
    _corrupt(run / "checkpoints/step-4/optimizer.safetensors", "scrambled", tmp_path / "m")
    (run / "adapter_model.safetensors").unlink()
    run_training(config(ref / "data", run, tiny_model_dir, resume=True))
    err = capsys.readouterr().err
    assert "checkpoints/step-4: optimizer.safetensors checksum mismatch; resuming from step-2" in err.splitlines()
    assert resumed_from(run) == [None, 2]
    assert_same_adapter(run, ref / "run")
    assert [p.name for p in list_checkpoints(run)] == ["step-2", "step-4"]  # step-4 written again, good
    verify_files(run / "checkpoints/step-4")


def test_no_good_checkpoint_is_one_line_data_error(ref, tiny_model_dir, tmp_path):
    run = _copy(ref, tmp_path)
    for ckpt in list_checkpoints(run):
        (ckpt / "rng.safetensors").write_bytes(b"")  # an empty file used to print "aborted" (exit 130)
    with pytest.raises(DataError) as e:
        run_training(config(ref / "data", run, tiny_model_dir, resume=True))
    msg = str(e.value)
    assert "\n" not in msg and "step-4: rng.safetensors checksum mismatch" in msg and "step-2: rng" in msg, msg


def _poison_after(monkeypatch, n_steps: int) -> None:
    """The optimizer's n-th step leaves a NaN in one trainable tensor (the loss of that step is still finite)."""
    real, calls = torch.optim.AdamW.step, []

    def step(self, *a, **kw):
        out = real(self, *a, **kw)
        calls.append(1)
        if len(calls) == n_steps:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)


def test_nan_step_is_never_saved_and_error_names_last_good(ref, tiny_model_dir, tmp_path, monkeypatch):
    _poison_after(monkeypatch, 4)
    out = tmp_path / "nan"
    with pytest.raises(ModelError) as e:
        run_training(config(ref / "data", out, tiny_model_dir))
    msg = str(e.value)
    assert "\n" not in msg and "step 4:" in msg and "not saved as a checkpoint" in msg, msg
    assert f"the last good checkpoint is {out / 'checkpoints/step-2'}" in msg, msg
    assert [p.name for p in list_checkpoints(out)] == ["step-2"] and not list((out / "checkpoints").glob(".*"))
    monkeypatch.undo()
    run_training(config(ref / "data", out, tiny_model_dir, resume=True))  # the named checkpoint resumes
    assert_same_adapter(out, ref / "run")


def test_nan_last_step_writes_no_final_adapter(ref, tiny_model_dir, tmp_path, monkeypatch):
    _poison_after(monkeypatch, 6)
    out = tmp_path / "nan"
    with pytest.raises(ModelError, match="not saved as the run's final weights; the last good checkpoint is .*step-4"):
        run_training(config(ref / "data", out, tiny_model_dir))
    assert not (out / "adapter_model.safetensors").exists() and not (out / "adapter_config.json").exists()


def test_damaged_final_adapter_is_refused(ref, objs, tmp_path):
    from mens.model.lora import load_adapter_weights

    run = _copy(ref, tmp_path)
    load_adapter_weights(objs["model"], run)  # intact: loads
    _corrupt(run / "adapter_model.safetensors", "scrambled", tmp_path / "m")
    with pytest.raises(ModelError, match="do not match the sha256 recorded"):
        load_adapter_weights(objs["model"], run)


def _enospc_on(monkeypatch, name: str, step_dir: str) -> None:
    real = atomic.write_file

    def write_file(path, data):
        if path.name == name and path.parent.name == f".tmp-{step_dir}":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(atomic, "write_file", write_file)


def _assert_full_disk_survived(err: DataError, out: Path, ref: Path, tiny_model_dir, *, kept: list[str],
                               says: str) -> None:
    msg = str(err)
    assert "\n" not in msg and "No space left on device" in msg and says in msg, msg
    assert [p.name for p in list_checkpoints(out)] == kept
    assert not list(out.rglob(".tmp-*")) and not (out / "adapter_model.safetensors").exists()
    for name in kept:
        verify_files(out / "checkpoints" / name)
    run_training(config(ref / "data", out, tiny_model_dir, resume=True))
    assert resumed_from(out) == [None, int(kept[-1][5:])]
    assert_same_adapter(out, ref / "run")


def test_full_disk_during_checkpoint_write_injected(ref, tiny_model_dir, tmp_path, monkeypatch):
    _enospc_on(monkeypatch, "optimizer.safetensors", "step-4")
    out = tmp_path / "full"
    with pytest.raises(DataError) as e:
        run_training(config(ref / "data", out, tiny_model_dir))
    monkeypatch.undo()
    _assert_full_disk_survived(e.value, out, ref, tiny_model_dir, kept=["step-2"], says="checkpoints/step-2 is intact")


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); the injected ENOSPC test covers the same promise")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize(("fill_at", "kept", "says"), [
    (("checkpoint.start", 4), ["step-2"], "checkpoints/step-2 is intact"),  # the step-4 checkpoint cannot be written
    (("checkpoint.renamed", 4), ["step-2", "step-4"], "writing the final weights failed"),  # the final adapter cannot
])
def test_full_disk_real_tmpfs(fill_at, kept, says, ref, tiny_model_dir, small_tmpfs, monkeypatch):
    """A real ENOSPC from the kernel: the tmpfs is filled up at `fill_at` (a checkpoint starting, or just written)."""
    filler = small_tmpfs / "filler"
    real = atomic.kill_point

    def fill(name, step):
        if (name, step) == fill_at and not filler.exists():
            with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to flush at close
                try:
                    while True:
                        f.write(bytes(4096))
                except OSError:
                    pass
                f.truncate(max(0, f.tell() - 8192))  # room for telemetry lines, not for weights
        return real(name, step)

    monkeypatch.setattr(atomic, "kill_point", fill)
    out = small_tmpfs / "run"
    with pytest.raises(DataError) as e:
        run_training(config(ref / "data", out, tiny_model_dir))
    monkeypatch.undo()
    filler.unlink()
    _assert_full_disk_survived(e.value, out, ref, tiny_model_dir, kept=kept, says=says)

"""bench/loss_step_ab.py: the baseline is the loss file of the named revision, loaded as a module of its own (the
tree's mens.train.loss untouched), and an unknown revision is an error, not a silent comparison with itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

ab = pytest.importorskip("loss_step_ab")


def _git_ok() -> bool:
    return subprocess.run(["git", "-C", str(BENCH.parent), "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _git_ok(), reason="not a git checkout")
def test_base_is_the_revisions_file_as_its_own_module():
    from mens.train import loss

    base = ab.load_base("HEAD")
    assert base is not loss and base.__name__ == "loss_base"
    assert callable(base.supervised_loss_sum) and base.supervised_loss_sum is not loss.supervised_loss_sum
    assert base._CHECKED is not loss._CHECKED  # its own caches: the tree's checks do not carry over


@pytest.mark.skipif(not _git_ok(), reason="not a git checkout")
def test_unknown_revision_fails():
    with pytest.raises(subprocess.CalledProcessError):
        ab.load_base("no-such-revision-0123")

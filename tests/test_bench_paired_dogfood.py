"""bench/paired_dogfood.py: each seed runs the pinned commit from a fresh clone and is recorded once; the
confirmation split is added once, to a finished run only. A stand-in repository (its `scripts/mens` and
`bench/dogfood.py` write what they were asked) keeps the test to seconds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import paired_dogfood as paired  # noqa: E402

MENS = f"""#!/usr/bin/env bash
# Stand-in for scripts/mens: builds the clone's venv and a finished dogfood directory, and says what it ran with.
mkdir -p .venv/bin df && ln -sf {sys.executable} .venv/bin/python
echo "$@ offline=$HF_HUB_OFFLINE isa=${{ONEDNN_MAX_CPU_ISA:-}} version=$(cat VERSION)" > df/asked
[ "$(cat VERSION)" != broken ]
"""
DOGFOOD = """import json, sys
a = sys.argv[1:]
out = a[a.index("--output") + 1]
if "--add-to" in a:
    rec = json.load(open(a[a.index("--add-to") + 1]))
    rec["confirm"] = {"tasks": 60, "modes": {"greedy": {"nonempty_parse_rate": 0.9, "pass_at_1": 0.75}}}
else:
    rec = {"commit": "c", "command_wall_s": float(a[a.index("--wall-s") + 1]), "note": a[a.index("--note") + 1],
           "asked": open("df/asked").read().strip(), "splits": [x for x in a if x in ("--features", "--confirm")],
           "heldout_tasks": 60, "train": {"steps": 5, "val_loss": 0.25}, "budget": {"recipe_steps": 5},
           "tuned": {"greedy": {"nonempty_parse_rate": 0.95, "pass_at_1": 0.8}}}
json.dump(rec, open(out, "w"))
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A repository with two commits: the first a working arm, the second one whose dogfood fails."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "bench").mkdir()
    (repo / "scripts" / "mens").write_text(MENS)
    (repo / "scripts" / "mens").chmod(0o755)
    (repo / "bench" / "dogfood.py").write_text(DOGFOOD)
    (repo / "VERSION").write_text("arm")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "arm")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "VERSION").write_text("broken")
    _git(repo, "commit", "-qam", "broken")
    return repo, first


def test_a_seed_runs_the_pinned_commit_from_a_fresh_clone_offline_and_is_recorded_with_the_features_split(repo,
                                                                                                          tmp_path):
    repo, first = repo
    work = tmp_path / "work"
    work.mkdir()
    record = paired.run_seed(repo, paired.resolve_commit(repo, first), "arm", 2, work, "rule r1", avx2_cap=True)
    rec = json.loads(record.read_text())
    assert record == work / "dogfood-arm-seed2.json"
    # The pinned commit ran, not the repository's newer HEAD; offline, capped, with the asked seed.
    assert rec["asked"] == "dogfood -o df --seed 2 offline=1 isa=AVX2 version=arm"
    assert rec["note"] == "rule r1" and rec["splits"] == ["--features"] and rec["command_wall_s"] >= 0
    status = (work / "status.log").read_text()
    assert "arm seed 2 start" in status and "arm seed 2 record rc=0" in status
    assert "held-out greedy 57/48" in paired.summary(rec)


def test_a_finished_record_is_never_overwritten_and_a_failed_run_is_an_error_with_its_log(repo, tmp_path):
    repo, first = repo
    work = tmp_path / "work"
    work.mkdir()
    paired.run_seed(repo, first, "arm", 0, work, "n")
    with pytest.raises(paired.PairedRunError, match="never overwritten"):
        paired.run_seed(repo, first, "arm", 0, work, "n")
    with pytest.raises(paired.PairedRunError, match=r"failed \(exit 1\).*run-broken-0.log"):
        paired.run_seed(repo, _git(repo, "rev-parse", "HEAD"), "broken", 0, work, "n")
    assert not paired.record_path(work, "broken", 0).exists()
    with pytest.raises(paired.PairedRunError, match="not in"):
        paired.resolve_commit(repo, "no-such-branch")


def test_the_confirmation_split_is_added_once_and_only_to_a_finished_run(repo, tmp_path):
    repo, first = repo
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(paired.PairedRunError, match="no finished run"):
        paired.confirm_seed("arm", 0, work)
    paired.run_seed(repo, first, "arm", 0, work, "n")
    rec = json.loads(paired.confirm_seed("arm", 0, work).read_text())
    assert rec["note"] == "n" and "confirm greedy 54/45" in paired.summary(rec)
    with pytest.raises(paired.PairedRunError, match="read once"):
        paired.confirm_seed("arm", 0, work)


def test_the_command_line_reports_a_refusal_without_a_traceback(tmp_path, capsys):
    assert paired.main(["--work", str(tmp_path), "confirm", "--tag", "none", "0"]) == 1
    assert "paired_dogfood: no finished run for none seed 0" in capsys.readouterr().err

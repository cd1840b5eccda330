"""Dogfood's training settings are the training config: a `train:` block of overrides over the shared preset
logic, and `--quick` is a preset (mens/configs/dogfood/quick.yaml). No training here."""

from __future__ import annotations

import pytest

from mens.dogfood.pipeline import Context, DogfoodConfig, quick_preset
from mens.dogfood.stages import train_config
from mens.errors import ConfigError, UsageError


def _tc(tmp_path, **kw):
    cfg = DogfoodConfig(output_dir=tmp_path / "df", device="cpu", **kw)
    return cfg, train_config(Context(cfg, log=lambda _: None))


def test_quick_is_a_preset_of_training_overrides_and_sizes(tmp_path):
    preset = quick_preset()
    cfg, tc = _tc(tmp_path, quick=True)
    assert (cfg.synthetic, cfg.tasks, cfg.limit, cfg.served_tasks) == tuple(
        preset[k] for k in ("synthetic", "tasks", "limit", "served_tasks"))
    assert (tc.max_steps, tc.batch_size, tc.eval_every, tc.save_every) == (20, 2, 10, 0)
    assert tc.preset == "cpu" and tc.data.path == str((tmp_path / "df" / "data").resolve())
    assert (tc.seed, tc.system_prompt, tc.model.name) == (cfg.seed, cfg.system_prompt, cfg.model)
    full, tc_full = _tc(tmp_path)
    assert (full.synthetic, full.limit, tc_full.max_steps, tc_full.batch_size) == (50, None, 0, 2)  # cpu preset


def test_train_block_overrides_quick_and_preset(tmp_path):
    _, tc = _tc(tmp_path, quick=True, train={"schedule.max_steps": 3, "optimizer": {"weight_decay": 0.5},
                                             "preset": "tiny"})
    assert (tc.max_steps, tc.weight_decay, tc.preset, tc.seq_len, tc.batch_size) == (3, 0.5, "tiny", 128, 2)
    _, tc = _tc(tmp_path, quick=True, train={"schedule": {"epochs": 1.5}})
    assert (tc.max_steps, tc.epochs) == (0, 1.5)  # an epochs count replaces --quick's step count


def test_vox_train_profile_reaches_dogfood(tmp_path, monkeypatch):
    monkeypatch.setenv("VOX_TRAIN_PROFILE", "safe")
    assert _tc(tmp_path)[1].preset == "4080_safe"


def test_bad_train_overrides_are_refused_at_once(tmp_path):
    with pytest.raises(ConfigError, match=r"dogfood train overrides: unknown key 'max_steps' \(did you mean "
                                          r"'schedule.max_steps'\?\)"):
        DogfoodConfig(output_dir=tmp_path, train={"max_steps": 3})
    with pytest.raises(ConfigError, match=r"schedule.batch_size = 0 \(expected greater than 0"):
        DogfoodConfig(output_dir=tmp_path, train={"schedule.batch_size": 0})
    with pytest.raises(UsageError, match="data.path are set by dogfood itself"):
        DogfoodConfig(output_dir=tmp_path, train={"data": {"path": "elsewhere"}})


def test_dogfood_flags_and_train_overrides_fill_one_block(tmp_path, monkeypatch):
    import mens.dogfood
    from mens.cli.main import app

    class Stop(Exception):
        pass

    seen = []

    def capture(cfg, log=None):
        seen.append(cfg)
        raise Stop  # before any stage runs

    monkeypatch.setattr(mens.dogfood, "run_dogfood", capture)
    with pytest.raises(Stop):
        app(args=["dogfood", "-o", str(tmp_path / "df"), "--quick", "--max-steps", "5", "--lr", "1e-3",
                  "--train", "schedule.warmup_steps=2", "--train", "optimizer.learning_rate=2e-3"],
            standalone_mode=False)
    assert seen[0].train == {"schedule": {"max_steps": 5, "warmup_steps": 2}, "optimizer": {"learning_rate": 2e-3}}
    with pytest.raises(ConfigError, match=r"--train 'schedule.warmup=2': unknown key"):
        app(args=["dogfood", "-o", str(tmp_path / "df"), "--train", "schedule.warmup=2"], standalone_mode=False)


def test_a_full_run_is_budgeted_to_30_minutes_unless_its_length_is_asked_for(tmp_path):
    """The default run fits 30 minutes; --budget none, --quick, --rounds 2 and an explicit length keep the recipe's."""
    assert DogfoodConfig(output_dir=tmp_path).budget == "30m"
    assert DogfoodConfig(output_dir=tmp_path, budget="1h").budget == "1h"
    assert DogfoodConfig(output_dir=tmp_path, budget="none").budget == "none"
    assert DogfoodConfig(output_dir=tmp_path, quick=True).budget is None
    assert DogfoodConfig(output_dir=tmp_path, rounds=2).budget is None
    assert DogfoodConfig(output_dir=tmp_path, train={"schedule": {"epochs": 1}}).budget is None
    assert DogfoodConfig(output_dir=tmp_path, train={"schedule.max_steps": 50}).budget is None

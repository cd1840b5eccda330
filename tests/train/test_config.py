"""The one training config: every field is a `mens train` option with its docstring as help; presets, files,
key=value overrides and flags layer in that order; --print-config; clear errors; the original's names and
runbook commands. No training here (tests/train/test_run_config.py trains)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml

from mens.cli.main import app
from mens.errors import ConfigError, UsageError
from mens.train.config import SPECS, TrainConfig
from mens.train.resolve import resolve_config

ORIGINAL_IDS = ["tiny", "safe", "4080", "4080_safe", "qwen_4080_16g", "qwen_small_8g", "qwen_rtx3090_24g",
                "qwen_a100_80g", "a100", "default", "distributed", "mobile_edge", "vox-gen", "auto"]
"""The original's known preset ids (reference §3.2: its preset file's twelve, `vox-gen`, and `auto`)."""
ORIGINAL_ROWS = {  # rank, alpha, seq_len, batch, grad_accum, epochs, warmup, lr (reference §3.2)
    "tiny": (4, 8, 128, 1, 1, 1, 10, 1e-4), "safe": (8, 16, 256, 2, 8, 3, 50, 2e-4),
    "4080": (16, 32, 384, 1, 8, 3, 80, 1.5e-4), "a100": (32, 64, 1024, 8, 2, 3, 200, 2e-4),
    "distributed": (16, 32, 512, 4, 8, 3, 150, 1.5e-4), "mobile_edge": (8, 16, 256, 1, 8, 3, 40, 1.5e-4),
    "vox-gen": (16, 32, 256, 2, 8, 5, 60, 1.5e-4)}


def _train_options() -> dict[str, object]:
    command = typer.main.get_command(app).commands["train"]
    return {name: p for p in command.params if p.param_type_name == "option" for name in [*p.opts, *p.secondary_opts]}


def _cli(capsys, *args: str) -> tuple[str, str]:
    """Run `mens train ARGS` in-process; (stdout, stderr)."""
    assert app(args=["train", *args], standalone_mode=False) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_every_config_field_is_an_option_whose_help_is_its_docstring():
    options = _train_options()
    for spec in SPECS.values():
        assert spec.doc, f"{spec.path} has no docstring"
        for flag in spec.flags:
            assert flag in options, f"{spec.path}: no option {flag}"
            assert options[flag].help == spec.doc, spec.path
    # and nothing else poses as a setting: each option is a field, one of the original's flags, or the command's own
    own = {"--print-config", "--background", "--log-dir", "--gate", "--gate-bench", "--gate-limit", "--help"}
    original = {n for n in options if n.startswith(("--qlora-", "--tokenizer", "--deployment-target"))}
    fields = {f for s in SPECS.values() for f in s.flags} | {f"--no-{s.flags[0][2:]}" for s in SPECS.values()}
    assert set(options) - own - original - fields == set()


def test_yaml_round_trip_and_flat_access():
    cfg = TrainConfig(data="d", output_dir="o", model="m", backend="lora", seq_len=96, r=4, system_prompt="a\nb: c",
                      extra={"k": [1, 2]})
    assert yaml.safe_load(cfg.to_yaml()) == cfg.model_dump()
    assert TrainConfig(**yaml.safe_load(cfg.to_yaml())) == cfg
    assert (cfg.seq_len, cfg.r, cfg.model.name, cfg.data.path, cfg.to_dict()["model"]) == (96, 4, "m", "d", "m")
    assert "#" in cfg.to_yaml().splitlines()[0]  # each key under its docstring
    cfg.max_steps = 3  # a flat write lands in its section
    assert cfg.schedule.max_steps == 3 and cfg.to_dict()["max_steps"] == 3


def test_precedence_defaults_preset_file_overrides_flags(tmp_path, capsys):
    preset = tmp_path / "mine.yaml"  # a user's preset: the same shape as a config file
    preset.write_text("adapter: {r: 2, lora_alpha: 3}\ndata: {seq_len: 64}\nschedule: {batch_size: 5, epochs: 2}\n")
    file = tmp_path / "run.yaml"
    file.write_text(f"preset: {preset}\nadapter: {{r: 6}}\nschedule: {{batch_size: 7, max_steps: 9}}\n")
    out, _ = _cli(capsys, str(file), "schedule.max_steps=11", "optimizer.learning_rate=1e-3", "--lr", "5e-3",
                  "--data-dir", "d", "--output-dir", "o", "--print-config")
    cfg = yaml.safe_load(out)
    assert cfg["adapter"]["lora_alpha"] == 3 and cfg["data"]["seq_len"] == 64  # preset beats defaults
    assert cfg["adapter"]["r"] == 6 and cfg["schedule"]["batch_size"] == 7  # file beats preset
    assert cfg["schedule"]["max_steps"] == 11  # override beats file
    assert cfg["optimizer"]["learning_rate"] == 5e-3  # flag beats override
    assert cfg["optimizer"]["weight_decay"] == 0.01 and cfg["schedule"]["epochs"] == 2  # untouched: lower layers
    assert cfg["preset"] == str(preset) and cfg["data"]["path"] == str(Path.cwd().resolve() / "d")
    again = resolve_config(file=file, overrides=["schedule.max_steps=11", "optimizer.learning_rate=5e-3"],
                           flags={"data": "d", "output_dir": "o"})
    assert again.model_dump() == cfg  # --print-config prints exactly what a run would use


def test_settings_that_had_no_flag_are_settable(capsys):
    out, _ = _cli(capsys, "--warmup-steps", "7", "--weight-decay", "0.1", "--max-grad-norm", "0.5", "--preset", "cpu",
                  "optimizer.weight_decay=0.2", "--print-config")
    opt = yaml.safe_load(out)["optimizer"]
    assert (yaml.safe_load(out)["schedule"]["warmup_steps"], opt["weight_decay"], opt["max_grad_norm"]) == (7, 0.1, 0.5)


@pytest.mark.parametrize(("args", "error", "message"), [
    (["schedule.max_stepz=3"], ConfigError, r"override 'schedule.max_stepz=3': unknown key .*did you mean "
                                            r"'schedule.max_steps'"),
    (["max_steps=3"], ConfigError, r"unknown key 'max_steps' \(did you mean 'schedule.max_steps'\?\)"),
    (["lr=3"], ConfigError, r"did you mean 'optimizer.learning_rate'"),
    (["schedule.max_steps=lots"], ConfigError, r"override 'schedule.max_steps=lots': schedule.max_steps = 'lots' "
                                               r"\(expected a valid integer.*flag --max-steps\)"),
    (["adapter.lora_dropout=1.5"], ConfigError, r"adapter.lora_dropout = 1.5 \(expected less than 1"),
    (["model.backend=qlora4"], ConfigError, r"expected one of qlora, lora, full; flag --backend"),
    (["--max-steps", "-1"], ConfigError, r"--max-steps: schedule.max_steps = -1 \(expected greater than or equal"),
    (["data.ce_last_k=600"], ConfigError, r"data.ce_last_k = 600 > data.seq_len = 512"),
    (["--fit-to-time"], ConfigError, r"schedule.fit_to_time is on but schedule.max_time_s is 0"),
    (["eval.eval_every=often"], ConfigError, r"eval.eval_every = 'often' \(expected a valid integer or 'epoch'; "
                                             r"flag --eval-every\)"),
    (["--eval-every", "0.5"], ConfigError, r"--eval-every: eval.eval_every = '0.5' \(expected a valid integer or"),
    (["nofile.yaml"], UsageError, r"nofile.yaml: no such config file"),
    (["schedule.max_steps=3", "stray"], UsageError, r"'stray': expected key.sub=value"),
])
def test_bad_overrides_name_the_key_and_value(args, error, message):
    with pytest.raises(error, match=message):
        app(args=["train", *args, "--preset", "cpu", "--print-config"], standalone_mode=False)


def test_bad_config_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schedule:\n  max_steps: [1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: not valid YAML"):
        resolve_config(file=bad)
    bad.write_text("schedule: 3\n")
    with pytest.raises(ConfigError, match="schedule must be a mapping"):
        resolve_config(file=bad)
    bad.write_text("seq_len: 64\n")  # a flat key: the file says where it belongs
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key 'seq_len' \(did you mean 'data.seq_len'\?\)"):
        resolve_config(file=bad)


def test_training_needs_data_and_output_dir():
    with pytest.raises(UsageError, match="missing --data-dir .* and --output-dir"):
        app(args=["train", "--preset", "cpu"], standalone_mode=False)


@pytest.mark.parametrize("name", ORIGINAL_IDS)
def test_every_original_preset_id_resolves(name, capsys):
    out, _ = _cli(capsys, "--preset", name, "--data-dir", "d", "--output-dir", "o", "--print-config")
    cfg = yaml.safe_load(out)
    if name in ORIGINAL_ROWS:
        got = (cfg["adapter"]["r"], cfg["adapter"]["lora_alpha"], cfg["data"]["seq_len"], cfg["schedule"]["batch_size"],
               cfg["schedule"]["grad_accum"], cfg["schedule"]["epochs"], cfg["schedule"]["warmup_steps"],
               cfg["optimizer"]["learning_rate"])
        assert got == ORIGINAL_ROWS[name]
    if name == "mobile_edge":  # the original's mobile-edge target trains on the CPU
        assert cfg["device"] == "cpu"


def test_original_preset_file_ids_are_all_accepted(shared_vox):
    ids = [str(p["id"]) for p in yaml.safe_load((shared_vox / "mens-reference/contracts/training-presets.v1.yaml")
                                                .read_text())["presets"]]
    assert len(ids) == 12 and set(ids) <= set(ORIGINAL_IDS)


def test_vox_train_profile_is_the_fallback_preset(monkeypatch):
    monkeypatch.setenv("VOX_TRAIN_PROFILE", "4080")
    assert resolve_config().preset == "qwen_4080_16g"
    assert resolve_config(flags={"preset": "tiny"}).preset == "tiny"  # a named preset wins
    monkeypatch.setenv("VOX_TRAIN_PROFILE", "nope")
    with pytest.raises(ConfigError, match="VOX_TRAIN_PROFILE='nope' is not a preset"):
        resolve_config()


def test_the_original_runbook_train_command_answers_with_notes(capsys):
    out, err = _cli(capsys, "--backend", "qlora", "--tokenizer", "hf", "--preset", "qwen_4080_16g", "--model",
                    "Qwen/Qwen3.5-4B", "--data-dir", "target/dogfood", "--output-dir", "mens/runs/qwen35_qlora",
                    "--device", "cuda", "--qlora-require-full-proxy-stack", "--print-config")
    cfg = yaml.safe_load(out)
    assert cfg["model"] == {**cfg["model"], "name": "Qwen/Qwen3.5-4B", "backend": "qlora"} and cfg["device"] == "cuda"
    notes = err.strip().splitlines()
    assert len(notes) == 2 and all(n.startswith("note: --") for n in notes)
    assert "--tokenizer hf" in notes[0] and "proxy" in notes[1]


@pytest.mark.parametrize(("args", "key", "value"), [
    (["--device", "best"], "device", "auto"), (["--device", "nvidia"], "device", "cuda"),
    (["--device", "metal"], "device", "mps"), (["--warmup", "7"], "schedule.warmup_steps", 7),
    (["--qlora-ce-last-k", "64"], "data.ce_last_k", 64),
    (["--validation-split-ratio", "0.1"], "eval.val_fraction", 0.1),
    (["--deployment-target", "mobile_edge"], "device", "cpu"),
    (["--qlora-no-double-quant", "--qlora-max-skip-rate", "0.2", "--qlora-proxy-max-layers", "8"],
     "extra", {"original_flags": {"qlora_no_double_quant": True, "qlora_max_skip_rate": 0.2,
                                  "qlora_proxy_max_layers": 8}}),
])
def test_the_originals_flag_spellings(args, key, value, capsys):
    out, _ = _cli(capsys, *args, "--preset", "cpu", "--print-config")
    got = yaml.safe_load(out)
    for part in key.split("."):
        got = got[part]
    assert got == value


@pytest.mark.parametrize(("args", "message"), [
    (["--tokenizer", "vox"], "--tokenizer vox: mens trains with the base model's own tokenizer only"),
    (["--qlora-lm-head-only"], "--qlora-lm-head-only: refused"),
    (["--qlora-max-skip-rate", "1.5"], r"expected a value in 0\.\.1"),
    (["--qlora-require-full-proxy-stack", "--qlora-allow-partial-proxy-stack"], "contradict"),
    (["--deployment-target", "mobile-edge", "--device", "cuda"], "trains on the CPU"),
])
def test_the_originals_refusals_are_one_line(args, message):
    with pytest.raises(UsageError, match=message) as e:
        app(args=["train", *args, "--preset", "cpu", "--print-config"], standalone_mode=False)
    assert "\n" not in str(e.value)


def test_yaml_words_and_extra_notes(tmp_path, capsys):
    file = tmp_path / "c.yaml"
    file.write_text("fsdp: on\nmodel: {backend: lora, autocast: off}\ndevice: best\n")  # YAML 1.1 reads on/off as bools
    out, _ = _cli(capsys, str(file), "--extra", "team=vox", "--extra", "ticket=25", "--print-config")
    cfg = yaml.safe_load(out)
    assert (cfg["fsdp"], cfg["model"]["autocast"], cfg["device"]) == ("on", "off", "auto")
    assert cfg["extra"] == {"team": "vox", "ticket": "25"}

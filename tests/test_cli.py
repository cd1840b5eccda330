"""The CLI foundation: fast help without torch, errors mapped to exit codes with one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from mens.cli import main as cli_main
from mens.errors import ConfigError, GateFailed, MensError


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mens", *args], capture_output=True, text=True, timeout=60)


def test_help_lists_commands_without_importing_torch():
    code = "import sys; from mens.cli import main; main.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    res = _run("--help")
    assert res.returncode == 0
    assert "vox" in res.stdout


def test_version_prints_package_version():
    from mens import __version__

    res = _run("--version")
    assert res.returncode == 0 and __version__ in res.stdout


def test_unknown_command_is_usage_error():
    res = _run("no-such-command")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def _exit_of_a_command_raising(monkeypatch, capsys, exc: BaseException) -> tuple[int, str]:
    """(exit code, stderr) of `mens boom`, a command that raises `exc`."""
    def boom() -> None:
        raise exc

    app = typer.Typer()
    app.command("boom")(boom)
    app.command("other")(lambda: None)
    monkeypatch.setattr(cli_main, "app", app)
    with pytest.raises(SystemExit) as info:
        cli_main.main(["boom"])
    return info.value.code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(("exc", "code"), [(ConfigError("bad preset 'x'"), 2), (GateFailed("pass@1 0.1 < 0.5"), 1)])
def test_mens_errors_map_to_exit_codes_with_one_line(monkeypatch, capsys, exc: MensError, code: int):
    assert _exit_of_a_command_raising(monkeypatch, capsys, exc) == (code, f"error: {exc}")


@pytest.mark.parametrize(("exc", "code", "says"), [
    (OSError(28, "No space left on device", "runs/r1/telemetry.jsonl"), 2,
     "No space left on device: runs/r1/telemetry.jsonl (errno 28)"),
    (KeyError("completion"), 3, "internal error (a bug in mens): KeyError: 'completion'; run the command again with "
                                "--debug"),
])
def test_os_errors_and_bugs_are_one_line_too(monkeypatch, capsys, exc, code, says):
    """A full disk or an unexpected bug never shows a user a traceback: one line, and --debug for the rest."""
    got, err = _exit_of_a_command_raising(monkeypatch, capsys, exc)
    assert got == code and says in err and "\n" not in err and "Traceback" not in err


def test_debug_flag_shows_traceback(monkeypatch):
    app = typer.Typer()

    @app.callback()
    def _cb(debug: bool = typer.Option(False, "--debug")) -> None: ...

    @app.command()
    def boom() -> None:
        raise ConfigError("x")

    monkeypatch.setattr(cli_main, "app", app)
    with pytest.raises(ConfigError):
        cli_main.main(["--debug", "boom"])


def _command_paths() -> list[list[str]]:
    import typer.main

    root = typer.main.get_command(cli_main.app)
    paths = []

    def walk(cmd, prefix):
        subs = getattr(cmd, "commands", None)
        if not subs:
            paths.append(prefix)
            return
        for name, sub in subs.items():
            walk(sub, [*prefix, name])

    walk(root, [])
    return paths


def test_every_subcommand_help_exits_zero():
    from typer.testing import CliRunner

    runner = CliRunner()
    paths = _command_paths()
    assert ["vox", "check"] in paths and ["gate"] in paths
    for path in paths:
        res = runner.invoke(cli_main.app, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)


def test_dogfood_gate_verdict_says_an_unenforced_quick_gate_is_not_a_failure():
    from mens.cli.dogfood import gate_verdict

    assert gate_verdict(True, enforced=True) == "passed"
    assert gate_verdict(None, enforced=True) == "not run"
    assert gate_verdict(False, enforced=True) == "FAILED"
    assert gate_verdict(False, enforced=False).startswith("not met")


def test_dogfood_says_what_the_budget_cut_and_what_the_whole_recipe_costs_here():
    from mens.cli.dogfood import budget_line

    cut = {"budget_s": 1800.0, "steps": 170, "recipe_steps": 742, "step_s": 6.04, "whole_recipe_s": 5482.0}
    line = budget_line(cut, "30m")
    assert line.startswith("budget 30m: trained 170 of the recipe's 742 steps, 6.0 s a step on this machine")
    assert "about 92 min here (--budget none)" in line  # 5,482 s, rounded up
    assert budget_line(None, "30m") is None and budget_line({**cut, "whole_recipe_s": None}, "30m") is None


def test_dogfood_served_tasks_flag_reaches_the_parity_stage_config(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import mens.dogfood

    seen = {}

    def fake_run(cfg):
        seen["cfg"] = cfg
        raise MensError("stop here")

    monkeypatch.setattr(mens.dogfood, "run_dogfood", fake_run)
    runner = CliRunner()
    runner.invoke(cli_main.app, ["dogfood", "-o", str(tmp_path / "a"), "--served-tasks", "60"])
    assert seen["cfg"].served_tasks == 60
    runner.invoke(cli_main.app, ["dogfood", "-o", str(tmp_path / "b"), "--quick"])
    assert seen["cfg"].served_tasks == 2  # unset: the quick default
    assert runner.invoke(cli_main.app, ["dogfood", "--served-tasks", "0"]).exit_code == 2


def test_serve_max_batch_flag_reaches_the_engine(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import mens.model.hf_engine
    import mens.model.inference
    import mens.serve.server

    seen = {}

    class FakeEngine:
        model_id, constrained_language = "fake", None

        def __init__(self, loaded, language=None, *, max_batch=1):
            seen["max_batch"] = max_batch
            self.max_batch = max_batch

    class FakeServer:
        def run(self):
            seen["ran"] = True

    monkeypatch.setattr(mens.model.inference, "load_for_inference", lambda path, device="auto": object())
    monkeypatch.setattr(mens.model.hf_engine, "HFEngine", FakeEngine)
    monkeypatch.setattr(mens.serve.server, "build_server", lambda app, **kw: FakeServer())
    runner = CliRunner()
    assert runner.invoke(cli_main.app, ["serve", str(tmp_path), "--max-batch", "3"]).exit_code == 0
    assert seen == {"max_batch": 3, "ran": True}
    runner.invoke(cli_main.app, ["serve", str(tmp_path)])
    assert seen["max_batch"] == 8  # the default
    assert runner.invoke(cli_main.app, ["serve", str(tmp_path), "--max-batch", "0"]).exit_code == 2


def test_bitsandbytes_optional_kernel_warning_is_quieted_by_its_own_logger_name(capsys):
    """On an AVX512-BF16 CPU bitsandbytes warns, on import, that it could not fetch a Hub kernel; the CLI quiets
    exactly that module's logger (a renamed module would make the warning reach users again)."""
    import logging

    ops = pytest.importorskip("bitsandbytes.backends.cpu.ops")
    with pytest.raises(SystemExit):
        cli_main.main(["--version"])
    assert ops.logger.name == "bitsandbytes.backends.cpu.ops"
    assert not ops.logger.isEnabledFor(logging.WARNING) and ops.logger.isEnabledFor(logging.ERROR)

"""The package itself: embedded corpus, shipped schemas, CLI help and exit codes, no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mens.corpus.extract import embedded_root
from mens.corpus.golden_header import parse_header
from mens.corpus.schemas import MODELS, SCHEMA_DIR, schema_text
from mens.lang import get_language

COMMANDS = ["extract", "validate", "pairs", "mix", "eval", "generate"]


def test_embedded_corpus_has_40_described_programs_that_parse():
    files = sorted(embedded_root("vox").glob("*.vox"))
    vox = get_language("vox")
    assert len(files) >= 40
    kinds = set()
    for f in files:
        text = f.read_text(encoding="utf-8")
        res = vox.parse(text)
        assert res.has_code, (f.name, res.first_error)
        assert parse_header(text).training_prompt, f"{f.name} has no // @training_prompt: line"
        kinds |= {vox.base_kind(k) for k, _ in res.decls}
    assert len(kinds) >= 20, sorted(kinds)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shipped_schemas_match_the_models(name):
    shipped = (SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8")
    assert shipped == schema_text(MODELS[name]), "run `python -m mens.corpus.schemas` to regenerate"


def test_corpus_imports_no_torch():
    code = ("import sys, pkgutil, importlib, mens.corpus\n"
            "for m in pkgutil.iter_modules(mens.corpus.__path__): importlib.import_module('mens.corpus.' + m.name)\n"
            "import mens.cli.corpus\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _mens(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mens", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_exits_zero(cmd):
    from typer.testing import CliRunner

    from mens.cli.main import app

    res = CliRunner().invoke(app, ["corpus", cmd, "--help"])
    assert res.exit_code == 0 and "Usage" in res.output


def test_cli_exit_codes(tmp_path: Path):
    (tmp_path / "empty.jsonl").write_text("")
    res = _mens("corpus", "validate", str(tmp_path / "empty.jsonl"), "-o", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2 and "file is empty" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "p", "response": "fn x( {"}) + "\n")
    (tmp_path / "g.yaml").write_text("corpus:\n  min_parse_rate: 0.5\n")
    res = _mens("corpus", "eval", str(tmp_path / "t.jsonl"), "-o", str(tmp_path / "e.json"),
                "--gates", str(tmp_path / "g.yaml"))
    assert res.returncode == 1 and "min_parse_rate" in res.stderr
    res = _mens("corpus", "extract", "-o", str(tmp_path / "u.jsonl"))
    assert res.returncode == 0 and "written" in res.stdout

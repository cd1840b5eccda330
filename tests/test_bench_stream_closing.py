"""bench/stream_closing.py: the wide closing leaves fewer prefixes waiting than the narrow one, on answers given."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import stream_closing  # noqa: E402


def test_counts_waiting_prefixes_of_each_closing(tmp_path):
    code = "@require(x > 0)\nfn f(x: int) to int {\n    let total = x + 1\n    return total\n}\n"
    rows = [{"prompt": "p", "response": f"```vox\n{code}```"}, {"prompt": "q", "response": code}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.json"
    assert stream_closing.main(["--data", str(tmp_path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["answers"] == 2 and doc["characters"] == 2 * len(code)
    narrow, wide = doc["narrow"], doc["wide"]
    assert 0 < wide["held_share"] < narrow["held_share"] < 1
    assert wide["longest_wait_chars"]["max"] < narrow["longest_wait_chars"]["max"]

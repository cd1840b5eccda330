"""What is served is what was trained: run dir (base + adapter), merged dir and server agree."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mens.evaluate.local import eval_local  # noqa: E402
from mens.merge.merge import merge_adapter  # noqa: E402
from mens.model.engine import GenerationRequest, Usage  # noqa: E402
from mens.model.generate import chat_input_ids  # noqa: E402
from mens.model.hf_engine import HFEngine  # noqa: E402
from mens.model.inference import load_for_inference  # noqa: E402


def test_engine_greedy_equals_transformers_on_merged_dir(tmp_path, make_tiny_run):
    trained, run, _ = make_tiny_run("lora")
    merged_dir = merge_adapter(run, tmp_path / "merged")
    loaded = load_for_inference(run, device="cpu")
    assert loaded.kind == "run" and loaded.system_prompt == "You write Vox."
    ids = torch.tensor([[1, 4, 8, 15, 16, 23, 42]])
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with torch.no_grad():
        a, b, c = trained(ids).logits, loaded.model(ids).logits, merged(ids).logits
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(b, c, atol=1e-4)

    engine = HFEngine(loaded)
    assert engine.context_length == 256  # read through the PEFT wrapper from the base config
    messages = [{"role": "user", "content": "Write add."}]
    usage = Usage()
    served = "".join(engine.stream(GenerationRequest(messages=messages, max_tokens=16), usage))
    merged_loaded = load_for_inference(merged_dir, device="cpu")
    assert merged_loaded.system_prompt == "You write Vox."  # merge carries the training prompt along
    prompt = chat_input_ids(merged_loaded.tokenizer, messages, merged_loaded.system_prompt)
    out = merged.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
    ref = merged_loaded.tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True)
    assert served == ref
    assert usage.prompt_tokens == len(prompt) and 0 < usage.completion_tokens <= 16


def test_eval_local_on_a_tiny_run_writes_a_complete_report(tmp_path, make_tiny_run):
    _, run, _ = make_tiny_run("lora")
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps({"id": f"t{i}", "category": "fn", "prompt": f"write f{i}",
                                           "expect": {"decls": [["fn", f"f{i}"]]}}) for i in range(3)) + "\n")
    out = eval_local(run, str(bench), language="python", modes=["greedy", "retry"], compare_base=True,
                     max_new_tokens=8, device="cpu")
    report = json.loads(out.read_text())
    assert out == run / "benchmark_results.json"
    assert report["metrics"]["tasks"] == 3 and set(report["modes"]) == {"greedy", "retry"}
    assert "gain_over_base" in report["metrics"] and report["base"]["metrics"]["tasks"] == 3
    assert len(report["results"]) == 3 and all(len(r["samples"]) == 1 for r in report["results"])
    assert report["failures"] and report["failures"][0]["reason"]

"""The merged model outside mens: plain transformers, no system message, greedy, against eval-local's answers.

Takes a finished `mens dogfood -o DIR` and, for every held-out prompt it evaluated, builds the prompt the way a
transformers or vLLM user would (`apply_chat_template` on the merged directory with the user turn only) and
generates greedily with plain `model.generate`. It reports how many prompts equal, token for token, the prompt
mens trained and evaluated with (`chat_input_ids` with the run's system prompt), and how many generations
reproduce eval-local's greedy answer: eval-local stops once an answer's code block closes, so a generation
matches when it starts with that answer. Writes bench/results/template-parity-<host>.json.
Run: `python bench/template_parity.py --from-dir DIR [--output F]`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from machine import REPO, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR` (merge done).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/template-parity-<host>.json).")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mens.dogfood.parity import finished_run
    from mens.model.generate import chat_input_ids

    out_dir = args.from_dir
    config, run, adapter = finished_run(out_dir)
    system_prompt = json.loads((run / "training_manifest.json").read_text(encoding="utf-8")).get("system_prompt")
    merged_dir = out_dir / "merged"
    tok = AutoTokenizer.from_pretrained(merged_dir)  # what a transformers user loads: no mens code on this path
    model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    run_tok = AutoTokenizer.from_pretrained(run)

    rows, t0 = [], time.time()
    for result in adapter:
        user = [{"role": "user", "content": result["prompt"]}]
        plain = tok.apply_chat_template(user, add_generation_prompt=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([plain]), max_new_tokens=config["max_new_tokens"], do_sample=False)
        text = tok.decode(out[0, len(plain):], skip_special_tokens=True)
        want = result["samples"][0]["output"]
        rows.append({"id": result["id"], "same_prompt": plain == chat_input_ids(run_tok, user, system_prompt),
                     "answer_reproduced": text.startswith(want.rstrip()), "eval_pass": result["samples"][0]["pass"]})
    wall = time.time() - t0
    doc = {"bench": "template_parity", **machine(), "run_dir": str(out_dir), "seed": config.get("seed"),
           "decoding": "greedy", "max_new_tokens": config["max_new_tokens"], "wall_s": round(wall, 1),
           "tasks": len(rows), "same_prompt": sum(r["same_prompt"] for r in rows),
           "answer_reproduced": sum(r["answer_reproduced"] for r in rows), "rows": rows}
    path = args.output or REPO / "bench" / "results" / f"template-parity-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"plain transformers, no system message: same prompt on {doc['same_prompt']}/{len(rows)}, eval-local's "
          f"greedy answer reproduced on {doc['answer_reproduced']}/{len(rows)}; {wall:.0f} s\nwrote {path}")


if __name__ == "__main__":
    main()

"""The GGUF export in llama.cpp against the merged model in transformers, on a finished dogfood run's held-out tasks.

Exports DIR/merged with `mens export --gguf` (llama.cpp's own converter) at each quant, loads each file in llama.cpp
(llama-cpp-python) and, for every held-out prompt eval-local evaluated, builds the prompt as a user of each would
(the chat template with no system message: the trained prompt is its default) and decodes greedily in both,
up to the run's max_new_tokens. Reports per quant how many prompts llama.cpp tokenizes as transformers does, how
many greedy answers equal transformers' token for token (and where the first differs), and how many answers parse
as Vox in each. Writes bench/results/gguf-parity-<host>.json.
Run: `python bench/gguf_parity.py --from-dir DIR [--quants f16,q8_0] [--output F]` (needs the export extra).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from machine import REPO, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR` (merge done).")
    ap.add_argument("--quants", default="f16,q8_0", help="Comma list of quants to export and compare.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/gguf-parity-<host>.json).")
    args = ap.parse_args()

    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mens.dogfood.parity import finished_run
    from mens.lang import get_language
    from mens.lang.checks import Expect, check_output
    from mens.merge.gguf import export_gguf, gguf_greedy, llama_cpp_python_version
    from mens.model.generate import stop_token_ids

    config, _run, adapter = finished_run(args.from_dir)
    merged_dir = args.from_dir / "merged"
    max_new = config["max_new_tokens"]
    tok = AutoTokenizer.from_pretrained(merged_dir)
    hf = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    stops = stop_token_ids(tok, hf)
    vox = get_language("vox")

    def parses(ids: list[int]) -> bool:
        check = check_output(tok.decode(ids, skip_special_tokens=True), Expect(), vox)
        return check.parse_ok and check.non_empty

    t0 = time.time()
    prompts, hf_answers = [], []
    for result in adapter:
        user = [{"role": "user", "content": result["prompt"]}]
        text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                              eos_token_id=sorted(stops), pad_token_id=sorted(stops)[0])
        prompts.append((result["id"], text, ids))
        hf_answers.append([t for t in out[0, len(ids):].tolist() if t not in stops])
    hf_s = time.time() - t0

    quants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quant in args.quants.split(","):
            t1 = time.time()
            exported = export_gguf(merged_dir, Path(tmp) / quant, quant=quant)
            export_s = time.time() - t1
            # One thread: llama.cpp's OpenMP workers spin at barriers; beside other jobs two threads ran up to
            # 100x slower than one on the 2-core VM.
            llm = Llama(str(exported.gguf), n_ctx=2048, n_threads=1, verbose=False)
            rows, t2 = [], time.time()
            for (task_id, text, ids), want in zip(prompts, hf_answers, strict=True):
                got = gguf_greedy(llm, ids, max_new_tokens=max_new, stop_ids=stops)
                first_diff = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                                  None if len(got) == len(want) else min(len(got), len(want)))
                rows.append({"id": task_id,
                             "same_tokenization": llm.tokenize(text.encode(), add_bos=False, special=True) == ids,
                             "same_ids": got == want, "first_difference_at": first_diff,
                             "tokens": len(got), "hf_tokens": len(want),
                             "parses": parses(got), "hf_parses": parses(want)})
            quants[quant] = {"file_mb": round(exported.gguf.stat().st_size / 2**20, 1), "export_s": round(export_s, 1),
                             "decode_s": round(time.time() - t2, 1),
                             "same_tokenization": sum(r["same_tokenization"] for r in rows),
                             "same_ids": sum(r["same_ids"] for r in rows), "parses": sum(r["parses"] for r in rows),
                             "rows": rows}
            del llm
    doc = {"bench": "gguf_parity", **machine(), "run_dir": str(args.from_dir), "seed": config.get("seed"),
           "llama_cpp_python": llama_cpp_python_version(), "llama_threads": 1, "decoding": "greedy",
           "max_new_tokens": max_new,
           "tasks": len(prompts), "hf_parses": sum(parses(a) for a in hf_answers), "hf_decode_s": round(hf_s, 1),
           "quants": quants,
           "note": "transformers runs the merged f32 weights; llama.cpp the exported file. Other helpers shared the "
                   "2 CPU cores during the run, so the seconds are indicative only."}
    path = args.output or REPO / "bench" / "results" / f"gguf-parity-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    for quant, q in quants.items():
        print(f"{quant}: same tokenization {q['same_tokenization']}/{len(prompts)}, greedy answer equal to "
              f"transformers' {q['same_ids']}/{len(prompts)}, parses {q['parses']}/{len(prompts)} "
              f"(transformers {doc['hf_parses']}/{len(prompts)})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

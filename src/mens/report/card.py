"""`mens card RUN`: a Hugging Face model card (README.md) built with huggingface_hub's `ModelCardData`/`ModelCard`.

The metadata is what the Hub expects: `base_model` as a Hub id (never a local path), the licence taken from the
base model, `library_name` peft for an adapter and transformers for merged weights, datasets only as Hub ids, and
the bench scores as `EvalResult`s (the model-index). Numbers come only from the run's artifacts
(benchmark_results.json, run_summary.json, training_manifest.json, gate_receipt.json, merge_parity.json); what was
not measured is said to be missing, never invented. The usage section covers transformers, peft, vLLM, Ollama
and llama.cpp, not only mens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mens.evaluate.passk import wilson_interval
from mens.model.lora import has_adapter
from mens.report.base_model import BaseModelInfo, base_model_info, is_hub_id
from mens.report.facts import (
    hyperparameters,
    num,
    rate,
    sample_answers,
    score_rows,
    served_vs_merged,
    training_numbers,
)
from mens.report.runfiles import RunFiles, read_run
from mens.run_records import (
    GATE_RECEIPT,
    HELDOUT_SPLIT,
    MERGE_PARITY,
    MODEL_CARD,
    BenchmarkResults,
    GateReceipt,
    HeldoutSplit,
    MergeParity,
    read_json,
)

TASK = ("text-generation", "Vox code generation")
PLOTS = (("parse_rate", "Non-empty parse rate by bench category, base vs tuned"),
         ("pass_at_1", "Task pass@1 by bench category, base vs tuned"), ("loss", "Training and validation loss"))
MODES_PLOT = "plots/modes.png"
EXAMPLE_REQUEST = "Write a Vox function add(a: int, b: int) to int."


@dataclass
class CardTarget:
    """What the card describes: the adapter of a run or merged weights, under which Hub id, with which files."""

    kind: str = "adapter"
    """"adapter" (a PEFT adapter on the base) or "merged" (full weights that load without peft)."""
    repo_id: str | None = None
    files: set[str] = field(default_factory=set)
    """Names of the files that travel with the card (to link plots and name a GGUF that is there)."""
    template_has_prompt: bool = False
    """Whether the chat template that travels with the model inserts the trained system prompt by default."""


def _model_name(files: RunFiles, target: CardTarget) -> str:
    return target.repo_id.split("/")[-1] if target.repo_id else files.run.name


def eval_results(files: RunFiles, model_name: str):
    """The bench scores of every tuned decoding mode as huggingface_hub `EvalResult`s (the card's model-index)."""
    from huggingface_hub import EvalResult

    bench = files.bench
    if not bench.metrics:
        return []
    bench_name = Path(str(bench.bench or "bench")).name.removesuffix(".jsonl")
    out = []
    for row in score_rows(bench):
        if not row.tuned:
            continue
        mode = row.mode
        metrics = [("nonempty_parse_rate", "non-empty parse rate", row.metrics.get("nonempty_parse_rate")),
                   ("pass@1", "task pass@1", row.metrics.get("pass_at_1"))]
        if bench.k > 1:
            metrics.append((f"pass@{bench.k}", f"task pass@{bench.k}", row.metrics.get("pass_at_k")))
        for mtype, mname, value in metrics:
            if not isinstance(value, (int, float)):
                continue
            out.append(EvalResult(task_type=TASK[0], task_name=TASK[1], dataset_type=f"mens/{bench_name}",
                                  dataset_name=f"Vox bench {bench_name} ({row.n} tasks)",
                                  dataset_split=str(bench.split or "heldout"), metric_type=mtype,
                                  metric_name=f"{mname} ({mode})", metric_config=mode, metric_value=round(value, 4)))
    return out


def card_data(files: RunFiles, target: CardTarget, base: BaseModelInfo, datasets: list[str]):
    """The card's `ModelCardData`."""
    from huggingface_hub import ModelCardData

    backend = files.manifest.backend
    adapter = target.kind == "adapter"
    tags = ["mens", "vox", "code", *([backend] if backend in ("lora", "qlora") else [])]
    if any(f.endswith(".gguf") for f in target.files):
        tags.append("gguf")
    extra = {}
    if base.hub_id:
        extra["base_model_relation"] = "adapter" if adapter else "finetune"
    if base.license_name:
        extra["license_name"] = base.license_name
    if base.license_link:
        extra["license_link"] = base.license_link
    name = _model_name(files, target)
    results = eval_results(files, name)
    return ModelCardData(base_model=base.hub_id, library_name="peft" if adapter else "transformers",
                         license=base.license, language=["en", "code"], pipeline_tag="text-generation", tags=tags,
                         datasets=[d for d in datasets if is_hub_id(d)] or None, model_name=name if results else None,
                         eval_results=results or None, **extra)


def _results_section(files: RunFiles, shown_files: set[str] = frozenset()) -> list[str]:
    bench = files.bench
    if not bench.metrics:
        return ["## Results", "", "Not evaluated yet: run `mens eval-local RUN --bench B --compare-base`.", ""]
    rows = score_rows(bench)
    k = bench.k
    n = bench.metrics.get("tasks", "?")
    lines = ["## Results", "",
             f"Held-out bench `{Path(str(bench.bench or '?')).name}`: {n} tasks the training data does not "
             f"contain, {k} answer(s) per task. A task passes when the answer parses and declares what was asked "
             "(kind, name, signature, required contents). Rates are shown with the count of tasks behind them.", "",
             "| model, decoding | n | non-empty parse rate | task pass@1 |" + (f" pass@{k} |" if k > 1 else "")
             + " construct coverage |",
             "|---|---|---|---|" + ("---|" if k > 1 else "") + "---|"]
    for row in rows:
        c = row.n if row.counts_tasks else None
        m = row.metrics
        lines.append(f"| {row.name} | {num(row.n)} | {rate(m.get('nonempty_parse_rate'), c)} | "
                     f"{rate(m.get('pass_at_1'), c)} |" + (f" {rate(m.get('pass_at_k'))} |" if k > 1 else "")
                     + f" {rate(m.get('coverage'))} |")
    if MODES_PLOT in shown_files:
        lines += ["", f"![Held-out scores of the base model and of each decoding mode]({MODES_PLOT})"]
    lines += _intervals(rows)
    fails = bench.metrics.get("failures_by_category") or {}
    if fails:
        lines += ["", "Remaining failures of the greedy answers, by first reason: "
                  + ", ".join(f"{k} {v}" for k, v in fails.items()) + "."]
    return [*lines, ""]


def _intervals(rows) -> list[str]:
    """95% intervals of the tuned greedy row's rates, where each is a count of tasks (one answer per task)."""
    row = next((r for r in rows if r.tuned), None)
    if row is None or not row.counts_tasks or row.n <= 0:
        return []
    parts = []
    for key, label in (("nonempty_parse_rate", "non-empty parse"), ("pass_at_1", "task pass@1")):
        value = row.metrics.get(key)
        if not isinstance(value, (int, float)) or abs(value * row.n - round(value * row.n)) > 0.01:
            continue
        hits = round(value * row.n)
        lo, hi = wilson_interval(hits, row.n)
        parts.append(f"{label} {hits} of {row.n}, {lo:.2f}-{hi:.2f}")
    if not parts:
        return []
    return ["", f"95% intervals of the {row.name} rates (Wilson): {'; '.join(parts)}. Two runs whose rates fall "
            "inside each other's intervals are not shown apart by this bench."]


def _samples_section(files: RunFiles) -> list[str]:
    samples = sample_answers(files.bench, passed=2, failed=2)
    if not samples:
        return []
    lines = ["## Sample held-out answers", "", "Greedy answers of this model to held-out requests, as generated:", ""]
    for s in samples:
        verdict = "passed" if s.passed else f"failed: {s.reason}"
        lines += [f"**{s.task}** ({verdict})", "", f"> {s.prompt}", "", "```vox", s.answer.strip()[:1200], "```", ""]
    return lines


def _gates_section(run: Path) -> list[str]:
    receipt = GateReceipt.read_optional(run / GATE_RECEIPT)
    if receipt is None:
        return ["## Gates", "", "No gate was run for this model.", ""]
    lines = ["## Gates", "", f"Overall: {'passed' if receipt.overall_passed else 'FAILED'}.", "",
             "| gate | threshold | value | passed |", "|---|---|---|---|"]
    for g in receipt.gates:
        lines.append(f"| {g.gate or g.name} | {num(g.threshold)} | {num(g.value)} | {'yes' if g.passed else 'no'} |")
    return [*lines, ""]


def _sample_size_limit(bench: BenchmarkResults) -> list[str]:
    metrics = bench.metrics
    cats = metrics.get("per_category") or {}
    sizes = [c["tasks"] for c in cats.values() if isinstance(c, dict) and isinstance(c.get("tasks"), int)]
    if not sizes:
        return []
    return [f"- The bench is small: {metrics.get('tasks')} tasks in {len(cats)} categor"
            f"{'y' if len(cats) == 1 else 'ies'}, as few as {min(sizes)} in a category, so one task moves a score "
            "a lot; read the numbers as a sketch."]


_SOURCES = {"pairs.jsonl": "pairs from the corpus's programs and declarations",
            "synthetic.jsonl": "synthetic programs (templates, every one parsed)",
            "tasks.jsonl": "task-shaped pairs (a request naming kind, name and signature; each answer checked "
                           "against exactly that)",
            "bench_dev.jsonl": "rows from the bench's dev split (its hand-written tasks and reference answers; the "
                               "held-out split is a different set of tasks)",
            "requests.jsonl": "hand-written requests in users' words (each answer parsed and checked like a bench "
                              "task)",
            "train.jsonl": "round-1 rows and focused task pairs"}


def _dogfood_data(cfg: dict) -> list[str]:
    """Where a `mens dogfood` run's data came from, and what the held-out split removed from it."""
    root = (cfg.get("extra") or {}).get("dogfood")
    if not root:
        return []
    mix = Path(root) / "corpus" / "mixed.mix_report.json"
    split = HeldoutSplit.read_optional(Path(root) / "data" / HELDOUT_SPLIT)
    lines = []
    if mix.is_file():
        doc = read_json(mix)
        for src in doc.get("sources", []) if isinstance(doc, dict) else []:
            name = Path(src["path"]).name
            lines.append(f"- {src['emitted_lines']} {_SOURCES.get(name, name)}")
    if split is not None:
        lines.append(f"- held out: {split.heldout_tasks} bench tasks no training row overlaps; {split.dropped} rows "
                     "were dropped because their code equals a held-out answer (normalized) or their prompt nearly "
                     f"copies a held-out prompt (word 3-gram Jaccard >= {split.prompt_near_dup_threshold})")
    return [*lines, ""] if lines else []


def _data_section(files: RunFiles, datasets: list[str]) -> list[str]:
    m = files.manifest
    ex = m.examples
    hub = [d for d in datasets if is_hub_id(d)]
    where = (f"Datasets on the Hub: {', '.join(f'[{d}](https://huggingface.co/datasets/{d})' for d in hub)}. "
             if hub else "The training data is local to the machine that trained this model (not on the Hub). ")
    return ["## Training data", "",
            f"{where}Training file sha256 `{m.data_sha256 or '?'}`; {num(ex.get('train', '?'))} training and "
            f"{num(ex.get('val', '?'))} validation examples.", "",
            *_dogfood_data(m.config)]


def _training_section(files: RunFiles) -> list[str]:
    m = files.manifest
    lines = ["## Training procedure", ""]
    prompt = m.system_prompt
    if prompt:
        lines += [f"System prompt used in training and evaluation: \"{prompt}\"", ""]
    hp = hyperparameters(m)
    if hp:
        lines += ["Hyperparameters (as resolved for this run):", "", "| setting | value |", "|---|---|",
                  *(f"| {k} | {v} |" for k, v in hp), ""]
    lines += ["How training went:", "", "| measured | value |", "|---|---|",
              *(f"| {k} | {v} |" for k, v in training_numbers(files)), ""]
    versions = m.versions
    if versions:
        lines += ["Software: " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "platform") + ".", ""]
    return lines


def _parity_section(run: Path) -> list[str]:
    """What `mens dogfood` measured after the merge: the merged model and the server against the adapter."""
    parity = MergeParity.read_optional(run / MERGE_PARITY)
    if parity is None:
        return []
    m, s = parity.merged_vs_adapter, served_vs_merged(parity)
    trained = "the adapter" if has_adapter(run) else "the trained weights"
    lines = ["## After the merge", "",
             f"The merged model gives the same task result as {trained} on {m.get('same_result')} of "
             f"{m.get('tasks')} held-out tasks ({m.get('same_text')} answers identical; greedy, same prompts); "
             f"`mens serve` on the merged model gives the same result on {s.get('same_result')} of {s.get('tasks')} "
             f"({s.get('same_text')} identical)."]
    if m.get("different_result"):
        lines.append(f"Tasks whose result changed in the merge: {', '.join(m['different_result'])}.")
    return [*lines, ""]


def _plots_section(target: CardTarget) -> list[str]:
    shown = [(name, title) for name, title in PLOTS if f"plots/{name}.png" in target.files]
    if not shown:
        return []
    return ["## Plots", "", *(f"![{title}](plots/{name}.png)\n" for name, title in shown)]


def _usage_section(files: RunFiles, target: CardTarget, base: BaseModelInfo) -> list[str]:
    repo = target.repo_id or f"your-name/{files.run.name}"
    prompt = files.manifest.system_prompt
    name = _model_name(files, target)
    ggufs = sorted(f for f in target.files if f.endswith(".gguf"))
    messages = [{"role": "user", "content": EXAMPLE_REQUEST}]
    if prompt and not target.template_has_prompt:
        messages.insert(0, {"role": "system", "content": prompt})
    msg_src = json.dumps(messages, ensure_ascii=False)
    template_note = ("The chat template inserts the training system prompt when a request has none (a request's "
                     "own system message still wins), so plain `apply_chat_template` prompts the model as it was "
                     "trained." if target.template_has_prompt and prompt else
                     "Send the training system prompt (below) as the first message: the model was trained and "
                     "evaluated with it.")
    lines = ["## How to use", "", template_note, ""]
    if not target.repo_id:
        lines += [f"`{repo}` stands for the Hub id this model is published under (`mens publish RUN --repo-id ID`).",
                  ""]
    gen = ["inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
           "return_dict=True)",
           "out = model.generate(**inputs, max_new_tokens=256, do_sample=False)",
           "print(tok.decode(out[0, inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))"]
    if target.kind == "merged":
        lines += ["### transformers", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
                  "", f"tok = AutoTokenizer.from_pretrained(\"{repo}\")",
                  f"model = AutoModelForCausalLM.from_pretrained(\"{repo}\")", f"messages = {msg_src}", *gen, "```",
                  ""]
    else:
        base_ref = f"[{base.hub_id}](https://huggingface.co/{base.hub_id})" if base.hub_id else "(see the note above)"
        lines += ["### peft (and transformers)", "",
                  "This repository holds a LoRA adapter; peft loads it on its base model " + base_ref
                  + ". transformers' `AutoModelForCausalLM.from_pretrained` loads it the same way when peft is "
                  "installed.", "",
                  "```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer",
                  "", f"tok = AutoTokenizer.from_pretrained(\"{repo}\")",
                  f"model = AutoPeftModelForCausalLM.from_pretrained(\"{repo}\")",
                  "# model = model.merge_and_unload()  # optional: fold the adapter in for faster inference",
                  f"messages = {msg_src}", *gen, "```", ""]
    lines += ["### vLLM", "", "```bash"]
    if target.kind == "merged":
        lines += [f"vllm serve {repo} --served-model-name {name}"]
    else:
        rank = files.manifest.config.get("r")
        if target.template_has_prompt:
            lines += [f"hf download {repo} chat_template.jinja --local-dir .   # the training chat format"]
        lines += [f"vllm serve {base.hub_id or 'BASE_MODEL'} \\",
                  f"  --enable-lora --lora-modules {name}={repo}" + (f" --max-lora-rank {rank}" if rank else "")
                  + (" \\" if target.template_has_prompt else "")]
        if target.template_has_prompt:
            lines += ["  --chat-template chat_template.jinja"]
    request = json.dumps({"model": name, "messages": [{"role": "user", "content": EXAMPLE_REQUEST}],
                          "temperature": 0}, indent=2, ensure_ascii=False).replace("'", "'\\''")
    lines += ["```", "", "An OpenAI-compatible server on port 8000; any OpenAI client works, or:", "", "```bash",
              "curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d '" + request + "'",
              "```", ""]
    if target.kind == "adapter":
        lines += ["vLLM applies the base model's chat template to LoRA requests unless `--chat-template` names this "
                  "repository's; without it, send the system prompt yourself.", ""]
    lines += ["### Ollama", ""]
    modelfile_gguf = "Modelfile" in target.files and bool(ggufs)
    if ggufs:
        lines += ["```bash", f"ollama run hf.co/{repo}", "```", "",
                  f"Ollama pulls the GGUF file ({', '.join(ggufs)}) straight from the Hub and picks a chat format "
                  "from its template; to use the training format, system prompt and stop strings exactly"
                  + (", create the model from this repository's Modelfile:" if modelfile_gguf else
                     ", write a Modelfile FROM the GGUF with them."), ""]
        if modelfile_gguf:
            lines += ["```bash", f"hf download {repo} {ggufs[0]} Modelfile --local-dir {name}",
                      f"cd {name} && ollama create {name} -f Modelfile && ollama run {name}", "```", ""]
    elif target.kind == "merged" and "Modelfile" in target.files:
        lines += ["```bash", f"hf download {repo} --local-dir {name}",
                  f"cd {name} && ollama create {name} -f Modelfile && ollama run {name}", "```", "",
                  "The Modelfile imports the safetensors weights (`FROM .`) with the training chat format, system "
                  "prompt and stop strings.", ""]
    else:
        lines += ["Use the merged weights: `mens merge RUN -o merged/` writes a directory with a Modelfile "
                  "(`ollama create NAME -f Modelfile`), or export a GGUF as below and point a Modelfile's `FROM` "
                  "at it.", ""]
    lines += ["### llama.cpp", ""]
    if ggufs:
        lines += ["```bash", f"hf download {repo} {ggufs[0]} --local-dir {name}",
                  f"llama-cli -m {name}/{ggufs[0]} -cnv            # chat in the terminal",
                  f"llama-server -m {name}/{ggufs[0]} --port 8080  # OpenAI-compatible server", "```", ""]
    else:
        lines += ["llama.cpp reads GGUF. This repository has no GGUF file; make one from the run with "
                  "`mens export RUN --gguf --quant q8_0` (llama.cpp's own converter, with a Modelfile FROM it) and "
                  "publish it with `mens publish ... --gguf EXPORT_DIR`, or convert the merged weights with "
                  "llama.cpp's `convert_hf_to_gguf.py`; then:", "",
                  "```bash", "llama-cli -m model.gguf -cnv", "```", ""]
    lines += ["### mens", ""]
    if target.kind == "merged":
        lines += ["```bash", f"hf download {repo} --local-dir {name}",
                  f"mens chat {name}                      # a terminal chat with the trained prompt",
                  f"mens serve {name} --port 8000         # OpenAI- and Ollama-compatible API",
                  f"mens serve {name} --constrained vox   # every answer parses", "```", ""]
    else:
        lines += ["`mens chat RUN` and `mens serve RUN` (`--constrained vox`: every answer parses) load this adapter "
                  "from the run directory that trained it, with its local base model; from the Hub, use the peft or "
                  "vLLM lines above, or the merged model (`mens merge RUN -o merged/`, then `mens publish merged/`).",
                  ""]
    return lines


def _summary(files: RunFiles, target: CardTarget, base: BaseModelInfo) -> list[str]:
    m = files.manifest
    base_ref = f"[{base.hub_id}](https://huggingface.co/{base.hub_id})" if base.hub_id else "a local base model"
    what = ("a LoRA adapter" if target.kind == "adapter" else
            "merged weights (the adapter folded into the base; no peft needed)" if has_adapter(files.run)
            or m.backend in ("lora", "qlora") else "fully fine-tuned weights")
    lines = [f"# {_model_name(files, target)}", "",
             f"A code assistant for the Vox language, fine-tuned by mens from {base_ref} "
             f"({m.backend or 'unknown'} training). This repository holds {what}. It answers requests with "
             "Vox code; the numbers below come from this run's own held-out benchmark and say how often that code "
             "parses and declares what was asked.", "",
             f"Licence: `{base.license}`" + (f", taken from {base.license_source}." if base.license_source else ".")]
    for note in base.notes:
        lines += ["", f"Note: {note}"]
    return [*lines, ""]


def build_model_card(run_dir: str | Path, target: CardTarget | None = None, *, datasets: list[str] | None = None,
                     allow_network: bool = False):
    """The huggingface_hub `ModelCard` of a run (its adapter, or merged weights with `target.kind="merged"`)."""
    from huggingface_hub import ModelCard

    files = read_run(run_dir)
    target = run_target(files) if target is None else target
    datasets = list(datasets or [])
    base = base_model_info(files.manifest, allow_network=allow_network)
    data = card_data(files, target, base, datasets)
    body = [*_summary(files, target, base), *_results_section(files, target.files),
            *_usage_section(files, target, base), *_samples_section(files), *_gates_section(files.run),
            *_parity_section(files.run), *_plots_section(target), *_data_section(files, datasets),
            *_training_section(files),
            "## Limits", "",
            "- Parsing is checked with mens's Vox frontend (upstream parser parity); it does not type-check or run "
            "the code, so an answer that passes can still compute the wrong thing.",
            "- The bench covers declaration kinds, names, parameters and required contents; it does not execute "
            "programs or judge style, and it has few multi-file or UI-behaviour tasks.",
            *_sample_size_limit(files.bench),
            "- A small base model: expect simple programs, and check what it writes.", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))


def template_has_prompt(model_dir: Path, prompt: str | None) -> bool:
    """Whether the chat template saved in `model_dir` carries `prompt` (mens writes it in as the default)."""
    if not prompt:
        return False
    for name, key in (("chat_template.jinja", None), ("tokenizer_config.json", "chat_template")):
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if key:
            try:
                text = str(json.loads(text).get(key) or "")
            except json.JSONDecodeError:
                continue
        if json.dumps(prompt, ensure_ascii=False)[1:-1] in text or prompt in text:
            return True
    return False


def run_target(files: RunFiles, repo_id: str | None = None) -> CardTarget:
    """The card of a run directory as it stands: its adapter (or full fine-tuned weights) and its plots."""
    merged = (files.run / "config.json").is_file() and not has_adapter(files.run)  # full weights, no adapter
    return CardTarget(kind="merged" if merged else "adapter", repo_id=repo_id,
                      files={f"plots/{p.name}" for p in (files.run / "plots").glob("*.png")},
                      template_has_prompt=template_has_prompt(files.run, files.manifest.system_prompt))


def build_card(run_dir: str | Path, *, repo_id: str | None = None) -> str:
    """The card of a run's adapter (or a full fine-tune's weights) as README.md text."""
    return str(build_model_card(run_dir, run_target(read_run(run_dir), repo_id)))


def write_card(run_dir: str | Path, *, repo_id: str | None = None) -> Path:
    """RUN/README.md: the card of the run's adapter (or full fine-tuned weights)."""
    out = Path(run_dir) / MODEL_CARD
    out.write_text(build_card(run_dir, repo_id=repo_id), encoding="utf-8")
    return out


def write_merged_card(run_dir: str | Path, merged_dir: str | Path, *, repo_id: str | None = None) -> Path:
    """MERGED/README.md: the card of merged weights (library transformers), described by the run they came from."""
    merged = Path(merged_dir)
    prompt = read_run(run_dir).manifest.system_prompt
    target = CardTarget(kind="merged", repo_id=repo_id, files={p.name for p in merged.iterdir() if p.is_file()},
                        template_has_prompt=template_has_prompt(merged, prompt))
    out = merged / MODEL_CARD
    build_model_card(run_dir, target).save(out)
    return out

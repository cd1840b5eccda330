"""`mens publish`: the folder a model goes to the Hugging Face Hub as, and its upload through huggingface_hub.

`stage_folder` writes exactly what is uploaded: the weights (the adapter, or the merged weights), the tokenizer and
its chat template, the trained system prompt, a Modelfile and GGUF files when the model directory has them, the
model card (README.md), the run's results and resolved training config (local paths reduced to file names), and
the plots. `publish` stages into a temporary folder and sends it with `create_repo` + `upload_folder`; the token
comes from huggingface_hub's usual sources (HF_TOKEN, `hf auth login`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mens.errors import DataError, UsageError
from mens.report.base_model import base_model_info
from mens.report.card import CardTarget, build_model_card, template_has_prompt
from mens.report.facts import PATH_KEYS
from mens.report.runfiles import as_manifest, read_run
from mens.run_records import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    BENCHMARK,
    GATE_RECEIPT,
    HANDOFF,
    MANIFEST,
    MERGE_PARITY,
    MODEL_CARD,
    SYSTEM_PROMPT,
    TRAINING_CONFIG,
    TrainingConfigRecord,
    TrainingManifest,
    write_json,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
MERGED_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "Modelfile")
RESULT_FILES = (GATE_RECEIPT, MERGE_PARITY)


@dataclass
class Source:
    """What is published: the directory with the weights, whether they are an adapter, and the run behind them."""

    model_dir: Path
    kind: str
    """"adapter" or "merged"."""
    run: Path
    """The run directory whose manifest and results describe the model (the model directory itself if none)."""


def resolve_source(path: str | Path, run: str | Path | None = None) -> Source:
    """A run directory (its adapter) or a merged/model directory (its weights, described by the run named in its
    hand-off file, or by `run`)."""
    p = Path(path)
    if (p / ADAPTER_CONFIG).is_file():
        return Source(p, "adapter", Path(run) if run else p)
    if not (p / "config.json").is_file():
        raise UsageError(f"{p}: not a run directory (adapter_config.json) nor a model directory (config.json); "
                         "pass the --output-dir of `mens train`, or the -o of `mens merge`")
    if run is None and (p / MANIFEST).is_file():
        run = p  # a full fine-tune: the run directory holds the weights
    if run is None and (p / HANDOFF).is_file():  # written by `mens merge`; names the run the weights came from
        try:
            named = json.loads((p / HANDOFF).read_text(encoding="utf-8")).get("adapter_path")
        except json.JSONDecodeError:
            named = None
        if named and Path(named).is_dir():
            run = Path(named)
    return Source(p, "merged", Path(run) if run else p)


def _place(src: Path, dst: Path, link: bool) -> None:
    """Copy `src` to `dst`; with `link`, hard-link where the filesystem allows (a temporary upload folder need not
    hold a second copy of the weights)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def _names_only(doc: dict, keys: tuple[str, ...] = ("model", "bench")) -> dict:
    """`doc` with the local paths under `keys` (at the top and in its "base" part) cut to their last component."""

    def cut(part: dict) -> dict:
        return {k: Path(v).name if k in keys and isinstance(v, str) and "/" in v else v for k, v in part.items()}

    out = cut(doc)
    if isinstance(doc.get("base"), dict):
        out["base"] = cut(doc["base"])
    return out


def _training_config(manifest: TrainingManifest | dict, hub_id: str | None) -> TrainingConfigRecord:
    """The run's resolved training settings without local paths (`manifest`: the run's, or a dict of its fields)."""
    manifest = as_manifest(manifest)
    cfg = {k: v for k, v in manifest.config.items() if k not in PATH_KEYS}
    if isinstance(cfg.get("model"), str) and ("/" in cfg["model"] and Path(cfg["model"]).exists()):
        cfg["model"] = hub_id
    keep = ("backend", "system_prompt", "examples", "steps", "seeds", "adapter", "packing", "gradient_checkpointing",
            "versions", "device", "world_size", "matmul_dtype", "started_at", "finished_at", "data_sha256")
    fields = manifest.to_json()
    extra = {k: fields[k] for k in keep if fields.get(k) not in (None, {}, [])}  # what the run recorded
    if isinstance(extra.get("adapter"), dict):  # module lists run to hundreds of names; the card names the kinds
        extra["adapter"] = {k: v for k, v in extra["adapter"].items() if k not in ("modules", "adapted_layers")}
    return TrainingConfigRecord(base_model=hub_id, config=cfg, **extra)


def stage_folder(path: str | Path, out: str | Path, *, repo_id: str | None = None, run: str | Path | None = None,
                 datasets: list[str] | None = None, gguf: str | Path | None = None, allow_network: bool = False,
                 link: bool = False) -> list[str]:
    """Write the folder `mens publish` uploads into `out` (new or empty); returns its files, relative, sorted.

    `gguf`: a `mens export --gguf` directory (its GGUF files and the Modelfile FROM them) or one GGUF file, published
    beside the weights."""
    src = resolve_source(path, run)
    ggufs = _gguf_files(gguf) if gguf is not None else []
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--dry-run {out}: exists and is not an empty directory; choose a new one")
    out.mkdir(parents=True, exist_ok=True)
    files = read_run(src.run)
    base = base_model_info(files.manifest, allow_network=allow_network)
    d = src.model_dir
    if src.kind == "adapter":
        cfg = json.loads((d / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        if base.hub_id:  # peft and vLLM fetch the base by this name: a Hub id, not this machine's cache path
            cfg["base_model_name_or_path"] = base.hub_id
        (out / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        weights = [d / ADAPTER_WEIGHTS]
    else:
        weights = sorted(d.glob("*.safetensors"))
        if not weights:
            raise DataError(f"{d}: no *.safetensors weights to publish; pass a `mens merge` output directory")
        weights += [d / f for f in MERGED_FILES if (d / f).is_file()]
    weights += sorted(d.glob("*.gguf"))
    for f in [*weights, *(d / f for f in TOKENIZER_FILES if (d / f).is_file())]:
        _place(f, out / f.name, link)
    for f in ggufs:
        _place(f, out / f.name, link)
    if ggufs and (ggufs[0].parent / "Modelfile").is_file():  # FROM the GGUF beside it: replaces a `FROM .` one
        (out / "Modelfile").unlink(missing_ok=True)
        _place(ggufs[0].parent / "Modelfile", out / "Modelfile", False)
    if not any((out / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise DataError(f"{d}: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json) to publish with "
                        "the model; a run or merge writes them: rerun `mens merge`")
    prompt = files.manifest.system_prompt or (
        (d / SYSTEM_PROMPT).read_text(encoding="utf-8") if (d / SYSTEM_PROMPT).is_file() else None)
    if prompt:
        (out / SYSTEM_PROMPT).write_text(prompt, encoding="utf-8")
    if BENCHMARK in files.present:
        write_json(out / BENCHMARK, _names_only(files.bench.to_json()))
    for name in RESULT_FILES:
        if (src.run / name).is_file():
            _place(src.run / name, out / name, False)
    if MANIFEST in files.present:
        _training_config(files.manifest, base.hub_id).write(out / TRAINING_CONFIG)
    from mens.report.html import write_plots

    write_plots(files, out / "plots")
    if not any((out / "plots").iterdir()):
        (out / "plots").rmdir()
    staged = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    target = CardTarget(kind=src.kind, repo_id=repo_id, files=staged | {MODEL_CARD},
                        template_has_prompt=template_has_prompt(out, prompt))
    card = build_model_card(src.run, target, datasets=datasets, allow_network=allow_network)
    card.save(out / MODEL_CARD)
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def _gguf_files(gguf: str | Path) -> list[Path]:
    p = Path(gguf)
    found = [p] if p.is_file() and p.suffix == ".gguf" else sorted(p.glob("*.gguf")) if p.is_dir() else []
    if not found:
        raise UsageError(f"--gguf {p}: no .gguf file there; pass the output directory of `mens export RUN --gguf` "
                         "or a .gguf file")
    return found


def card_problems(readme: str | Path) -> list[str]:
    """What huggingface_hub finds wrong with a model card without the network: the YAML parses into
    `ModelCardData` with metadata errors raised (not ignored), the model-index converts to `EvalResult`s and back
    unchanged, `base_model` and `datasets` are valid Hub ids, and the licence is set. Empty when all hold."""
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results

    from mens.report.base_model import is_hub_id

    problems = []
    try:
        card = ModelCard.load(readme, ignore_metadata_errors=False)
    except ValueError as e:
        return [f"{readme}: the card's metadata does not parse: {e}"]
    data = card.data.to_dict()
    if not data.get("license"):
        problems.append("no license in the metadata")
    bases = data.get("base_model")
    for b in [bases] if isinstance(bases, str) else (bases or []):
        if not is_hub_id(b):
            problems.append(f"base_model {b!r} is not a Hub id")
    for ds in data.get("datasets") or []:
        if not is_hub_id(ds):
            problems.append(f"dataset {ds!r} is not a Hub id")
    index = data.get("model-index")
    if index:
        name, results = model_index_to_eval_results(index)
        if eval_results_to_model_index(name, results) != index:
            problems.append("the model-index does not survive a round trip through EvalResult")
    return problems


def publish(path: str | Path, repo_id: str, *, private: bool = False, run: str | Path | None = None,
            datasets: list[str] | None = None, gguf: str | Path | None = None, log=print) -> str:
    """Stage the folder and upload it to the Hub as `repo_id` (created when missing); returns the repository URL."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    check_repo_id(repo_id)
    if not get_token():
        raise UsageError("no Hugging Face token: run `hf auth login` or set HF_TOKEN (a token with write access), "
                         "or pass --dry-run DIR to write the folder without uploading")
    with tempfile.TemporaryDirectory(prefix="mens-publish-") as tmp:
        staged = stage_folder(path, Path(tmp) / "repo", repo_id=repo_id, run=run, datasets=datasets, gguf=gguf,
                              allow_network=True, link=True)
        problems = card_problems(Path(tmp) / "repo" / MODEL_CARD)
        if problems:
            raise DataError(f"the model card for {repo_id} is not valid: {'; '.join(problems)}")
        log(f"uploading {len(staged)} files to {repo_id}")
        api = HfApi()
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            api.upload_folder(folder_path=Path(tmp) / "repo", repo_id=repo_id, repo_type="model",
                              commit_message="Upload model trained with mens")
        except HfHubHTTPError as e:
            status = getattr(e.response, "status_code", "?")
            raise UsageError(f"the Hub refused {repo_id} (HTTP {status}): {_first_line(e)}; check that the token "
                             "can write to that namespace") from None
        except Exception as e:
            # These two calls only talk to the Hub: whatever else they raise is the network or the Hub (the HTTP
            # client's own types vary across huggingface_hub versions), said in one line; --debug shows the chain.
            raise UsageError(f"could not upload to the Hub ({type(e).__name__}: {_first_line(e)}); check the "
                             "network (and that HF_HUB_OFFLINE is not set), then run the command again") from e
    return str(url)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def check_repo_id(repo_id: str) -> None:
    """`owner/name` as the Hub accepts it, else a UsageError."""
    from mens.report.base_model import is_hub_id

    if not is_hub_id(repo_id):
        raise UsageError(f"--repo-id {repo_id!r}: expected owner/name (letters, digits, '-', '_', '.'), "
                         "e.g. your-name/vox-coder")

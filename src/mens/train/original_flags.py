"""The original's `vox mens train` flags that are not settings of mens (reference §1.2), accepted so that its
runbook's commands run: each one is honoured, recorded or refused, with a one-line note where mens differs.

The original's flags that are settings (`--rank`, `--warmup`, `--qlora-ce-last-k`, `--validation-split-ratio`...)
are command-line names of config fields (mens.train.config); `--device best` etc. are device aliases there.
"""

from __future__ import annotations

from dataclasses import dataclass

from mens.errors import UsageError


@dataclass(frozen=True)
class OriginalFlag:
    """One flag: its name, value type and the help line that says what mens does with it."""

    name: str
    kind: type
    help: str

    @property
    def key(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


FLAGS = (
    OriginalFlag("--tokenizer", str, "The original's tokenizer choice: `hf` (the model's own tokenizer) is what mens "
                                     "always uses, so it changes nothing; `vox` is refused."),
    OriginalFlag("--qlora-no-double-quant", bool, "Recorded only, as in the original: mens' NF4 base keeps double "
                                                  "quantization."),
    OriginalFlag("--qlora-require-full-proxy-stack", bool, "Accepted: mens has no proxy layers (every decoder layer "
                                                           "is the model's own); --strict-targets fails on any "
                                                           "projection left unadapted."),
    OriginalFlag("--qlora-allow-partial-proxy-stack", bool, "Accepted (no proxy layers in mens); refused together "
                                                            "with --qlora-require-full-proxy-stack, as in the "
                                                            "original."),
    OriginalFlag("--qlora-lm-head-only", bool, "Refused, as by the original's trainer."),
    OriginalFlag("--qlora-max-skip-rate", float, "Checked to be in 0..1, then recorded only, as in the original."),
    OriginalFlag("--qlora-proxy-max-layers", int, "Recorded only: mens has no proxy layers (the original refused "
                                                  "0 and values below the layer count; --lora-layers N adapts the "
                                                  "top N)."),
    OriginalFlag("--deployment-target", str, "workstation (default) or mobile-edge, which trains on the CPU (the "
                                             "original requires --device cpu for it)."),
)


def translate(given: dict, *, device: str | None) -> tuple[dict, dict, list[str]]:
    """The original's flag values (None = not given) -> (flat settings to set, values to record in the manifest's
    `extra`, one-line notes). Refusals are UsageErrors that say what to do instead."""
    settings: dict = {}
    record: dict = {}
    notes: list[str] = []
    tokenizer = given.get("tokenizer")
    if tokenizer is not None:
        if tokenizer.lower() != "hf":
            raise UsageError(f"--tokenizer {tokenizer}: mens trains with the base model's own tokenizer only (the "
                             "original's `vox` tokenizer belonged to its legacy scratch trainer and is refused for "
                             "QLoRA there too); drop the flag or pass --tokenizer hf")
        notes.append("--tokenizer hf: mens always uses the base model's own tokenizer; the flag changes nothing")
    if given.get("qlora_lm_head_only"):
        raise UsageError("--qlora-lm-head-only: refused (the original's trainer refuses it too); LoRA adapts every "
                         "decoder-layer projection, or the top N layers with --lora-layers N")
    if given.get("qlora_require_full_proxy_stack") and given.get("qlora_allow_partial_proxy_stack"):
        raise UsageError("--qlora-require-full-proxy-stack with --qlora-allow-partial-proxy-stack: they contradict "
                         "each other (the original refuses the pair too); pass one")
    if given.get("qlora_require_full_proxy_stack") or given.get("qlora_allow_partial_proxy_stack"):
        notes.append("--qlora-*-proxy-stack: mens has no proxy layers (every decoder layer is the model's own); "
                     "accepted, changes nothing")
    rate = given.get("qlora_max_skip_rate")
    if rate is not None:
        if not 0.0 <= rate <= 1.0:
            raise UsageError(f"--qlora-max-skip-rate {rate}: expected a value in 0..1")
        record["qlora_max_skip_rate"] = rate
        notes.append("--qlora-max-skip-rate: recorded in the manifest only (as in the original)")
    if given.get("qlora_no_double_quant"):
        record["qlora_no_double_quant"] = True
        notes.append("--qlora-no-double-quant: recorded in the manifest only (as in the original); the NF4 base "
                     "keeps double quantization")
    layers = given.get("qlora_proxy_max_layers")
    if layers is not None:
        record["qlora_proxy_max_layers"] = layers
        notes.append("--qlora-proxy-max-layers: recorded only; mens has no proxy layers (--lora-layers N adapts "
                     "only the top N decoder layers)")
    target = given.get("deployment_target")
    if target is not None:
        target = target.replace("_", "-")
        if target not in ("workstation", "mobile-edge"):
            raise UsageError(f"--deployment-target {given['deployment_target']}: expected workstation or mobile-edge")
        record["deployment_target"] = target
        if target == "mobile-edge":
            if device not in (None, "cpu"):
                raise UsageError(f"--deployment-target mobile-edge with --device {device}: the mobile-edge target "
                                 "trains on the CPU (as the original requires); pass --device cpu or drop --device")
            settings["device"] = "cpu"
    return settings, record, notes

"""JSON Schemas of the corpus records, generated from the pydantic models and shipped in `schemas/`.

Other tools validate mens' files with these without mens installed. A test keeps them in step with the
models. Run: `python -m mens.corpus.schemas` (rewrites the files).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from mens.corpus.records import TrainPair
from mens.corpus.tool_trace import ToolTraceRecord
from mens.corpus.units import CorpusUnit

SCHEMA_DIR = Path(__file__).parent / "schemas"
MODELS: dict[str, type[BaseModel]] = {
    "train_pair": TrainPair,
    "corpus_unit": CorpusUnit,
    "tool_trace_record": ToolTraceRecord,
}


def schema_text(model: type[BaseModel]) -> str:
    """The model's JSON Schema (draft 2020-12), pretty-printed, with a trailing newline."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema()}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, model in MODELS.items():
        path = directory / f"{name}.schema.json"
        path.write_text(schema_text(model), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_schemas():
        print(p)

"""Fixtures for tests/train: tiny model directories, a data directory, one torch thread per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))  # train_tiny (helpers) under --import-mode=importlib

from train_tiny import build_model_dir, vox_rows, write_jsonl  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    write_jsonl(d / "train.jsonl", vox_rows(40))
    return d


@pytest.fixture(autouse=True)
def _threads():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)



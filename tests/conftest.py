"""Shared fixtures: offline hub, the shared Vox corpus (skipped cleanly when absent), GPU skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_VOX = Path(os.environ.get("MENS_SHARED_VOX", REPO_ROOT.parent / "shared" / "corpus" / "vox"))


@pytest.fixture(scope="session")
def shared_vox() -> Path:
    """The shared real Vox corpus (../shared/corpus/vox); tests that need it skip when it is absent."""
    if not (SHARED_VOX / "expected_parse_results.jsonl").is_file():
        pytest.skip(f"shared Vox corpus not found at {SHARED_VOX} (set MENS_SHARED_VOX to point at it)")
    return SHARED_VOX


def pytest_collection_modifyitems(config, items):
    # GPU-only paths are marked `gpu` and skipped without CUDA (never import torch just to collect).
    if not any("gpu" in item.keywords for item in items):
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)

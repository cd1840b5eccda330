"""tests/corpus: make the shared hostile-input builders (hostile_inputs.py) importable under --import-mode=importlib."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

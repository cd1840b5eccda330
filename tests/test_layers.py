"""The package boundaries of docs/architecture (design.md's table), checked on the import statements of src/.

An import under `if TYPE_CHECKING:` is a type hint, not a dependency, and is not counted.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "mens"
SHARED = {"errors", "run_records"}
ALLOWED = {
    "lang": set(),
    "corpus": {"lang"},
    "model": set(),
    "train": {"model", "corpus", "lang"},
    "evaluate": {"lang", "model"},
    "merge": {"model"},
    "serve": {"lang", "model"},
    "report": {"evaluate", "model"},
    "dogfood": {"lang", "corpus", "model", "train", "evaluate", "merge", "serve", "report"},
}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            nodes.update(id(n) for n in ast.walk(node))
    return nodes


def package_imports(src: Path = SRC) -> dict[str, dict[str, set[str]]]:
    """package -> imported mens package -> files that import it."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in src.rglob("*.py"):
        parts = path.relative_to(src).parts
        if len(parts) < 2:
            continue
        tree = ast.parse(path.read_text("utf-8"))
        hints = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in hints:
                continue
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("mens.") and name.split(".")[1] != parts[0]:
                    found[parts[0]][name.split(".")[1]].add(str(path.relative_to(src)))
    return found


def test_every_package_imports_only_the_layers_below_it():
    imports = package_imports()
    wrong = {f"{pkg} -> {dep}: {sorted(files)}" for pkg, deps in imports.items() if pkg in ALLOWED
             for dep, files in deps.items() if dep not in ALLOWED[pkg] | SHARED}
    assert not wrong, "imports across the layer table:\n" + "\n".join(sorted(wrong))
    assert set(imports) - {"cli"} <= set(ALLOWED), "a new package needs a row in ALLOWED"


def test_the_check_sees_a_sideways_import(tmp_path):
    """The checker is not vacuous: an evaluate module importing serve is reported."""
    fake = tmp_path / "mens"
    (fake / "evaluate").mkdir(parents=True)
    (fake / "evaluate" / "x.py").write_text("def f():\n    from mens.serve.app import create_app\n")
    assert package_imports(fake)["evaluate"]["serve"] == {"evaluate/x.py"}

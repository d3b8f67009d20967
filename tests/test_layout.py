"""Imports go one way: server -> dlr_runtime <- training; clients need no torch (an AST scan,
and the import-linter contracts of pyproject.toml: layers, independence, no circles)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "dlr_runtime": {"server", "training", "clients"},
    "training": {"server", "clients"},
    "server": {"training", "clients"},
    "clients": {"torch", "torchaudio", "dlr_runtime", "server", "training", "onnxruntime"},
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package: str) -> None:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        hits = imported_roots(path) & FORBIDDEN[package]
        if hits:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(hits)}")
    assert not bad, "\n".join(bad)


def test_import_contracts() -> None:
    """The import-linter contracts of pyproject.toml: package arrows, the layers inside server/
    and server/sessions/, independent routes, and no import circle inside any package."""
    pytest.importorskip("importlinter")
    import contextlib
    import io
    import os

    from importlinter.cli import lint_imports

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    finally:
        os.chdir(cwd)
    assert code == 0, out.getvalue()

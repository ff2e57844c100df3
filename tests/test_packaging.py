"""The package layout: namespace mapping, no generic top-level modules, math layer never imports upward."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MATH_MODULES = ["adwin/losses.py", "adwin/logprobs.py", "adwin/divergences.py", "adwin/importance.py",
                "adwin/window.py", "adwin/alignment.py", "adwin/audit_grams.py", "adwin/config.py", "adwin/sketch.py"]
UPPER = ("adwin.controller", "adwin.probes", "adwin.trainer_adapters", "adwin.trainer", "adwin.cli",
         "adwin.commands", "adwin.tasks", "adwin.bench", "adwin.rollout", "adwin.teacher",
         "adwin.parts", "adwin.step", "adwin.probing", "adwin.accounting", "adwin.evaluate")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", MATH_MODULES)
def test_math_layer_never_imports_upward(module):
    bad = sorted(n for n in _imports(ROOT / module) if n.startswith(UPPER) or n.split(".")[0] in
                 ("controller", "probes", "trainer_adapters"))
    assert not bad, f"{module} imports upper layers: {bad}"


def test_rooms_import_under_the_adwin_namespace():
    import adwin.controller
    import adwin.probes
    import adwin.trainer_adapters

    assert Path(adwin.controller.__file__).parent == ROOT / "controller"
    assert Path(adwin.probes.__file__).parent == ROOT / "probes"
    assert Path(adwin.trainer_adapters.__file__).parent == ROOT / "trainer_adapters"


def test_every_package_directory_is_listed_in_pyproject():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for pkg, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    # a sub-package of a mapped folder that is itself mapped is reached twice; keep the mapped name
    missing = sorted(p for p in found if p not in listed)
    assert not missing, f"packages missing from pyproject.toml: {missing}"


@pytest.mark.slow
def test_wheel_has_no_generic_top_level_modules(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("adwin-*.whl"))
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert "adwin" in tops
    assert not tops & {"controller", "probes", "trainer_adapters", "tests", "configs"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "adwin/controller/api.py" in names and "adwin/probes/__init__.py" in names

"""The package layout: namespace mapping, no generic top-level modules, one import direction per layer."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"adwin": "adwin", "adwin.controller": "controller", "adwin.probes": "probes",
           "adwin.trainer_adapters": "trainer_adapters", "adwin.configs": "configs"}

# The pipeline's layers, bottom first. A module may import its own layer and the layers below it,
# never one above (function-level imports count too).
LAYERS: list[tuple[str, ...]] = [
    # math of the losses; the optional engines (vLLM); the student as parameters (LoRA, FSDP, its structure, its
    # optimizer); the student's decode engine (token sampler, KV-cache and static-cache paths)
    ("adwin.objectives", "adwin.backends", "adwin.student", "adwin.decode"),
    # alignment audit; window policies; rollouts, prompts; the teacher's scorers; the built-in tasks (which serve
    # their prompts as the sampling package's, and whose prepare measures accuracy with the evaluation's sampler)
    ("adwin.audit", "adwin.policies", "adwin.sampling", "adwin.teacher", "adwin.tasks"),
    ("adwin.config", "adwin.configs"),  # pydantic models of a run; the YAML presets
    ("adwin.controller", "adwin.teacher_server"),  # the HTTP services: controller, teacher server
    ("adwin.probes",),
    ("adwin.runtime",),  # checkpoints, resume, guards, logging, degraded mode
    ("adwin.loop",),  # the synchronous trainer
    ("adwin.trainer_adapters", "adwin.bench"),
    ("adwin.train", "adwin.cli", "adwin.__main__"),  # commands
]
RANK = {group: i for i, groups in enumerate(LAYERS) for group in groups}


def _group(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "adwin" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _modules() -> list[tuple[str, Path]]:
    out = []
    for pkg, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([pkg, *parts]), path))
    return out


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "adwin":
                names.update(f"adwin.{a.name}" for a in node.names)
    return names


MODULES = [(m, p) for m, p in _modules() if _group(m) is not None]


def test_every_module_belongs_to_a_layer():
    unknown = sorted({_group(m) for m, _ in MODULES} - set(RANK))
    assert not unknown, f"add these to LAYERS: {unknown}"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_module_imports_a_layer_above_its_own(module, path):
    own = RANK[_group(module)]
    bad = sorted(n for n in _imports(path) if _group(n) in RANK and RANK[_group(n)] > own)
    assert not bad, f"{module} (layer {own}) imports upper layers: {bad}"
    generic = sorted(n for n in _imports(path) if n.split(".")[0] in ("controller", "probes", "trainer_adapters"))
    assert not generic, f"{module} imports a top-level folder by its folder name: {generic}"


# The import cycles left, each within one package (function-level imports count): a room that is not named here
# has none, and one that is named may lose its cycle but not grow another.
CYCLES_LEFT = {"adwin.config", "adwin.probes", "adwin.trainer_adapters"}


def _module_graph() -> dict[str, set[str]]:
    """Each adwin module -> the adwin modules it imports (``from P import name`` names module ``P.name`` when
    there is one, else ``P``)."""
    known = {m for m, _ in MODULES}

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in MODULES:
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(filter(None, (owner(a.name) for a in node.names)))
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    target = full if full in known else owner(node.module)
                    if target:
                        deps.add(target)
        graph[module] = deps - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_outside_the_known_ones():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder finds
    cycles = _cycles(_module_graph())
    bad = [c for c in cycles if {_group(m) for m in c} - CYCLES_LEFT or len({_group(m) for m in c}) > 1]
    assert not bad, f"import cycles: {bad}"


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
def test_wheel_has_no_generic_top_level_modules_and_builds_without_warnings(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    # a Python warning from the build backend prints as "FILE.py:LINE: Category: message" (e.g. setuptools'
    # "Package ... is absent from the `packages` configuration" for a data folder)
    warned = [line for line in (proc.stdout + proc.stderr).splitlines() if re.search(r"\.py:\d+: \w+: ", line)]
    assert not warned
    wheel = next(tmp_path.glob("adwin-*.whl"))
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert "adwin" in tops
    assert not tops & {"controller", "probes", "trainer_adapters", "tests", "configs"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "adwin/controller/api.py" in names and "adwin/probes/__init__.py" in names
    presets = {n for n in names if n.startswith("adwin/configs/") and n.endswith(".yaml")}
    assert presets == {f"adwin/configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")}  # shipped presets


def test_the_transformers_floor_is_the_version_ci_tests() -> None:
    """pyproject's oldest transformers is the one .ci/run reruns the model-touching tests on."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(d for d in deps if d.startswith("transformers"))
    pins = [x for x in (ROOT / ".ci" / "transformers-floor.txt").read_text().splitlines() if x.startswith("transformers")]
    assert pins == [floor.replace(">=", "==")]


def test_every_release_ci_tests_verl_on_is_one_pyproject_accepts() -> None:
    """verl's range (.ci/verl-range.txt) is an environment `pip install adwin verl==...` can give: each pin of a
    package adwin depends on (its own dependencies and the trl extra) meets adwin's range for it."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = {r.name.lower().replace("_", "-"): r.specifier for r in map(
        Requirement, [*project["dependencies"], *project["optional-dependencies"]["trl"]])}
    pins = [Requirement(x) for x in (ROOT / ".ci" / "verl-range.txt").read_text().splitlines()
            if x and not x.startswith("#")]
    names = {p.name.lower().replace("_", "-") for p in pins}
    assert {"verl", "transformers"} <= names
    for pin in pins:
        version = next(iter(pin.specifier)).version
        spec = ours.get(pin.name.lower().replace("_", "-"))
        assert spec is None or spec.contains(version), f"{pin} is outside adwin's {pin.name}{spec}"


def test_the_design_docs_layer_picture_names_the_packages_of_each_layer() -> None:
    """docs/design.md, "Layering": item ``k`` names (as ``adwin.<package>``) exactly the packages of ``LAYERS[k-1]``."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Layering", 1)[1].split("\n## ", 1)[0]
    items: dict[int, str] = {}
    current = None
    for line in section.splitlines():
        m = re.match(r"(\d+)\. (.*)", line)
        if m:
            current = int(m.group(1))
            items[current] = m.group(2)
        elif current is not None and line.startswith("   "):
            items[current] += " " + line.strip()
        elif line.strip():
            current = None
    assert sorted(items) == list(range(1, len(LAYERS) + 1))
    for k, groups in enumerate(LAYERS, start=1):
        named = {".".join(n.split(".")[:2]) for n in re.findall(r"`(adwin\.[a-z_]+(?:\.[a-z_]+)*)`", items[k])}
        assert named == set(groups) - {"adwin.__main__"}, (k, named, groups)

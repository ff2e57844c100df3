"""The first two parts of ``adwin bench gpu``: what the machine is (versions, device, bf16, free memory) and the
GPU-marked tests; plus the one way the bench bounds a part: a child process with a deadline."""

from __future__ import annotations

import ast
import logging
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)



class CudaUnavailable(OSError):
    """``--device cuda`` on a machine where torch sees no CUDA device (the CLI exits with status 2)."""


def setup_check(device: str) -> dict[str, Any]:
    """Versions, the device's name, bf16 support and free memory; ``CudaUnavailable`` for a CUDA device torch
    cannot see (before anything is built or loaded)."""
    import torch
    import transformers

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "transformers": transformers.__version__, "cuda_runtime": torch.version.cuda,
                            "device": device, "cpus": os.cpu_count(), "commit": source_commit()}
    if torch.device(device).type != "cuda":
        info |= {"device_name": platform.processor() or platform.machine(), "bf16": True}
        return info
    if not torch.cuda.is_available():
        raise CudaUnavailable(f"--device {device}: torch {torch.__version__} sees no CUDA device (torch.version.cuda "
                              f"= {torch.version.cuda}); install a CUDA build of torch or run --quick on the CPU")
    index = torch.device(device).index or 0
    free, total = torch.cuda.mem_get_info(index)
    major, minor = torch.cuda.get_device_capability(index)
    return info | {"device_name": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}",
                   "bf16": bool(torch.cuda.is_bf16_supported()), "free_gib": free / 2**30, "total_gib": total / 2**30}


def source_root() -> Path | None:
    """The checkout the package runs from (its ``pyproject.toml`` beside ``adwin/``); None for a wheel install."""
    import adwin

    root = Path(adwin.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def source_commit() -> str:
    """The checkout's commit (``+dirty`` when it has changes), else ``ADWIN_COMMIT`` from the environment (a copy
    of the tree without ``.git``, as a lent GPU machine gets), else ``unknown``."""
    root = source_root()
    if root is not None and (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head + ("+dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    return os.environ.get("ADWIN_COMMIT", "unknown")


def gpu_test_files(tests: Path) -> list[Path]:
    """Test modules that use the ``gpu`` mark (``pytest.mark.gpu`` in their code, not in a string), found without
    importing them: collecting the whole suite would import every optional package the other tests need, which
    a GPU image may lack."""
    def marks(path: Path) -> bool:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            return False
        return any(isinstance(n, ast.Attribute) and n.attr == "gpu" and isinstance(n.value, ast.Attribute)
                   and n.value.attr == "mark" for n in ast.walk(tree))
    return sorted(p for p in tests.rglob("test_*.py") if marks(p))


def gpu_tests(tests: Path | None, timeout_s: float, out: Path) -> dict[str, Any]:
    """``pytest -m gpu`` over the GPU-marked modules of ``tests`` (None: the checkout's ``tests/``), bounded by
    ``timeout_s``; counts read from pytest's JUnit XML. Skipped, with a note, when there is no tests folder."""
    if tests is None:
        root = source_root()
        tests = root / "tests" if root is not None else None
    if tests is None or not tests.is_dir():
        return {"status": "skipped", "note": "no tests folder beside the package (a wheel install): run it from a "
                                             "checkout, or name one with --tests"}
    files = gpu_test_files(tests)
    if not files:
        return {"status": "skipped", "note": f"no module under {tests} marks GPU tests"}
    xml = out / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={xml}",
           *map(str, files)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=_pytest_cwd(tests, out), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "cut", "seconds": time.perf_counter() - t0, "files": len(files),
                "note": f"pytest ran past {timeout_s:.0f} s"}
    (out / "gpu-tests.log").write_text(proc.stdout + proc.stderr)
    counts = junit_counts(xml) if xml.is_file() else {}
    if proc.returncode not in (0, 5):  # 5: every GPU test deselected
        status = "failed"
    else:
        status = "passed" if counts.get("passed") else "all skipped"
    return {"status": status, "seconds": time.perf_counter() - t0, "files": len(files), "exit_code": proc.returncode,
            **counts}


def _pytest_cwd(tests: Path, elsewhere: Path) -> Path:
    """Where pytest starts (its folder comes first on ``sys.path``): the checkout the package runs from, as
    ``make test`` does; for tests beside an installed wheel, a folder holding no ``adwin/``, whose source tree
    would otherwise shadow the wheel (the source tree alone cannot import ``adwin.controller``)."""
    return tests.parent if source_root() == tests.parent.resolve() else elsewhere


def junit_counts(xml: Path) -> dict[str, Any]:
    """passed / failed / skipped counts and the failed tests' names from pytest's JUnit XML."""
    root = ElementTree.parse(xml).getroot()
    cases = list(root.iter("testcase"))
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in cases
              if c.find("failure") is not None or c.find("error") is not None]
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    return {"tests": len(cases), "passed": len(cases) - len(failed) - skipped, "failed": len(failed),
            "skipped": skipped, "failed_names": failed}


def bounded(target: Callable[..., None], kwargs: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run ``target(**kwargs)`` in a fresh (spawned) process for at most ``timeout_s``: its GPU memory, compiled
    graphs and threads end with it. The target writes its own results to disk as it goes, so a cut one still
    leaves what it finished. Returns how it ended."""
    proc = multiprocessing.get_context("spawn").Process(target=target, kwargs=kwargs)
    t0 = time.perf_counter()
    proc.start()
    proc.join(max(timeout_s, 0.0))
    cut = proc.is_alive()
    if cut:
        proc.terminate()
        proc.join(15)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {"seconds": time.perf_counter() - t0, "cut": cut, "exit_code": proc.exitcode}

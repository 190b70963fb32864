"""pytest configuration for the package's doctests (``--doctest-modules`` on ``numbasep/``).

* Modules that import an optional dependency at module level (numba-cuda for
  ``backends/cuda``; TensorFlow, PyTorch, JAX, CuPy or matplotlib for the
  benchmark peers) are left out of doctest collection when that dependency is
  not installed, so ``pytest`` passes on a CPU-only install.
* As in ``tests/conftest.py``, numba's CUDA simulator is switched on when there
  is no GPU, so the CUDA backend's examples run anywhere (set before numba is
  imported; ``NUMBASEP_TEST_GPU=1`` forces the real device).

This file is only read by pytest; it imports nothing from numbasep.
"""

import ast
import importlib.util
import os
import shutil
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _gpu_present():
    if os.environ.get("NUMBASEP_TEST_GPU") == "1":
        return True
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


if not _gpu_present():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


_HAS_NUMBA_CUDA = _installed("numba_cuda")


def _requirement_missing(node):
    """True when a module-level import statement needs something not installed."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    else:
        return False
    for name in names:
        if name == "numba.cuda" or name.startswith("numba.cuda."):
            if not _HAS_NUMBA_CUDA:
                return True
        elif not _installed(name.split(".")[0]):
            return True
    return False


def _needs_missing_dependency(path):
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    # Only unguarded module-level imports count: one inside try/except or a
    # function is the module's own business.
    return any(_requirement_missing(node) for node in tree.body)


def _ignored():
    ignored = []
    if not _HAS_NUMBA_CUDA:
        ignored.append("backends/cuda")
    for path in sorted(_HERE.rglob("*.py")):
        rel = path.relative_to(_HERE).as_posix()
        if rel == "conftest.py" or any(rel.startswith(d + "/") for d in ignored):
            continue
        if _needs_missing_dependency(path):
            ignored.append(rel)
    return ignored


collect_ignore = _ignored()

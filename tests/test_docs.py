"""The README's examples run and print what the README says they print.

Each ```python block of README.md runs in a fresh namespace. A comment after a
``print(...)`` is the expected output: it must appear in what the block printed
(up to a ``...``, where the README abbreviates). A block whose first line is
``# requires: X`` runs only where X is usable (``numba-cuda``: the CUDA backend
loads, on the simulator when there is no GPU; ``cupy`` / ``torch``: the library
is installed and a GPU is present); elsewhere it is only compiled.
"""

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

import numbasep

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _blocks(lang):
    text = README.read_text(encoding="utf-8")
    return [(m.start(), m.group(1)) for m in
            re.finditer(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)]


def _line_of(offset):
    return README.read_text(encoding="utf-8").count("\n", 0, offset) + 1


PY_BLOCKS = _blocks("python")


def _cuda_backend():
    try:
        numbasep.backends.get("cuda")
        return True
    except Exception:
        return False


def _real_gpu():
    from numbasep.__main__ import cuda_status
    return cuda_status()[0]


def _usable(requirement):
    req = requirement.split()[0].strip(",")
    if req == "numba-cuda":
        return _cuda_backend()
    if importlib.util.find_spec(req) is None:
        return False
    return _cuda_backend() and _real_gpu()


def _expected_outputs(code):
    """Trailing comments of ``print(...)`` lines: (line, expected text)."""
    out = []
    for line in code.splitlines():
        m = re.match(r"\s*print\(.*\)\s*#\s?(.*)$", line)
        if m:
            out.append((line.strip(), m.group(1).split("...")[0].strip()))
    return out


def test_readme_has_python_examples():
    assert len(PY_BLOCKS) >= 6


@pytest.mark.parametrize("offset, code", PY_BLOCKS,
                         ids=[f"README.md:{_line_of(o)}" for o, _ in PY_BLOCKS])
def test_readme_python_block(offset, code):
    first = code.splitlines()[0]
    compiled = compile(code, f"README.md:{_line_of(offset)}", "exec")
    m = re.match(r"#\s*requires:\s*(.+)", first)
    if m and not _usable(m.group(1)):
        pytest.skip(f"needs {m.group(1)} (compiled only)")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compiled, {"__name__": "__readme__"})
    printed = buf.getvalue()
    for line, expected in _expected_outputs(code):
        assert expected in printed, f"{line!r} should print {expected!r}; printed:\n{printed}"


def test_readme_quick_start_matches_ci():
    """The README's test command is the one .ci/run runs."""
    bash = [code for _, code in _blocks("bash")]
    quick = [c.strip() for c in bash[:2]]
    assert quick[0].endswith("pip install -e . && python -m numbasep check")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_install = re.search(r"^python -m pip install -q (-e .+)$", ci, flags=re.M).group(1)
    ci_test = re.search(r"^(python -m pytest.*)$", ci, flags=re.M).group(1).strip()
    readme_parts = [p.strip() for p in quick[1].split("&&")]
    assert shlex.split(readme_parts[1])[2:] == shlex.split(ci_install)
    assert readme_parts[2] == ci_test


def test_readme_names_every_operator():
    text = README.read_text(encoding="utf-8")
    public = [n for n in numbasep.__all__ if callable(getattr(numbasep, n))
              and not isinstance(getattr(numbasep, n), type)]
    raw = ["DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
           "DepthwiseConv2dNativeBackpropFilter"]
    for name in public:
        assert f"numbasep.{name}`" in text or f"numbasep.{name}(" in text, name
    for name in raw:
        assert f"numbasep.raw_ops.{name}" in text and f"tf.raw_ops.{name}" in text, name
    for name in ("tf.nn.depthwise_conv2d", "tf.nn.separable_conv2d",
                 "keras.ops.depthwise_conv", "keras.ops.separable_conv"):
        assert name in text, name

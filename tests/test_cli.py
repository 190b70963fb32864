"""The command line: ``python -m numbasep info | check | bench``."""

import subprocess
import sys

import numpy as np
import pytest

import numbasep
from numbasep import __main__ as cli
from numbasep import _reference as R

import support

QUICK = ["check", "--device", "cpu", "--dtype", "float32", "--dtype", "bfloat16",
         "--rank", "2", "--layout", "channels_last"]


# ------------------------------------------------------------------ info

def test_info_prints_versions(capsys):
    import numba
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"numbasep           {numbasep.__version__}" in out
    assert numba.__version__ in out and np.__version__ in out
    for key in ("ml_dtypes", "numba-cuda", "threading layer", "threads", "cuda device",
                "compile cache"):
        assert key in out
    layer = [line for line in out.splitlines() if line.startswith("threading layer")][0]
    assert "not yet" not in layer and "unavailable" not in layer


def test_info_without_numba_cuda(monkeypatch, capsys):
    real = cli._dist_version
    monkeypatch.setattr(cli, "_dist_version",
                        lambda d: None if d == "numba-cuda" else real(d))
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "numba-cuda         not installed" in out
    assert "cuda device        none (numba-cuda is not installed" in out


# ------------------------------------------------------------------ check

def test_check_passes(capsys):
    assert cli.main(QUICK) == 0
    out = capsys.readouterr().out
    assert "Kernels compile on first use" in out
    # 7 operators (the raw ops run at rank 2) x 2 dtypes, all passing.
    assert "14 of 14 passed, 0 failed, 0 errors" in out
    rows = [line for line in out.splitlines() if line.startswith(tuple(cli.OPERATORS))]
    assert len(rows) == 14 and all(line.rstrip().endswith("ok") for line in rows)


def test_check_detects_a_wrong_result(monkeypatch, capsys):
    real = cli.OPERATORS["depthwise_conv"]

    def off_by_one(*a, **k):  # beyond every dtype's tolerance wherever |ref| is small
        r = real(*a, **k)
        return (r.astype(np.float64) + 1.0).astype(r.dtype)

    monkeypatch.setitem(cli.OPERATORS, "depthwise_conv", off_by_one)
    assert cli.main(QUICK + ["--op", "depthwise_conv", "--dtype", "float64"]) == 1
    out = capsys.readouterr().out
    assert "0 of 3 passed, 3 failed, 0 errors" in out
    assert out.count("FAIL") == 3


def test_check_detects_an_exception_and_a_wrong_dtype(monkeypatch, capsys):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    real = cli.OPERATORS["separable_conv_grad"]
    monkeypatch.setitem(cli.OPERATORS, "depthwise_conv2d_native_backprop_filter", boom)
    monkeypatch.setitem(cli.OPERATORS, "separable_conv_grad",
                        lambda *a, **k: tuple(r.astype(np.float64) for r in real(*a, **k)))
    code = cli.main(QUICK + ["--op", "depthwise_conv2d_native_backprop_filter",
                             "--op", "separable_conv_grad", "--op", "depthwise_conv"])
    assert code == 1
    out = capsys.readouterr().out
    assert "RuntimeError: kernel exploded" in out
    assert "has dtype float64, expected bfloat16" in out
    assert "2 of 6 passed, 0 failed, 4 errors" in out


def test_check_failures_only_and_usage_errors(capsys):
    assert cli.main(QUICK + ["--op", "depthwise_conv", "--failures-only"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 passed" in out and " ok" not in out
    # The raw ops are 2-D only: nothing left to check.
    assert cli.main(["check", "--device", "cpu", "--rank", "1",
                     "--op", "depthwise_conv2d_native"]) == 2
    assert cli.main(["check", "--dtype", "int8"]) == 2


def test_check_cuda_without_a_device(monkeypatch, capsys):
    monkeypatch.setattr(cli, "cuda_status", lambda: (False, "none (test)", False))
    assert cli.main(["check", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def _cuda_backend_loads():
    try:
        numbasep.backends.get("cuda")
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _cuda_backend_loads(), reason="the CUDA backend is not available")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_check_on_cuda(capsys, monkeypatch, dtype):
    # On the CUDA simulator when there is no GPU (tests/conftest.py): keep it tiny.
    # Host copies refuse bfloat16 as numba-cuda does on a GPU (where this case failed).
    support.refuse_bfloat16_buffers(monkeypatch)
    args = ["check", "--device", "cuda", "--op", "depthwise_conv", "--dtype", dtype,
            "--rank", "1", "--layout", "channels_last"]
    assert cli.main(args) == 0, capsys.readouterr().out
    assert "1 of 1 passed" in capsys.readouterr().out


# ------------------------------------------------------------------ the reference itself

def test_reference_hand_checked_case():
    x = np.arange(1, 13, dtype=np.float64).reshape(1, 2, 3, 2)
    w = np.arange(1, 17, dtype=np.float64).reshape(2, 2, 2, 2)
    y = R.raw_forward(x, w, [1, 1, 1, 1], "VALID")
    assert y.ravel().tolist() == [196, 216, 272, 296, 252, 280, 344, 376]


@pytest.mark.parametrize("padding", ["valid", "same", "causal"])
def test_reference_gradients_are_adjoint(padding):
    # <dy, conv(x, w)> is bilinear: its gradients are the reference's backprops.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 9, 3))
    w = rng.standard_normal((3, 3, 2))
    kw = dict(strides=(2,), padding=padding, channels_first=False, dilations=(2,))
    y = R.keras_depthwise(x, w, **kw)
    dy = rng.standard_normal(y.shape)
    dx, dw = R.keras_depthwise_grad(x, w, dy, **kw)
    x2, w2 = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    assert np.isclose(np.sum(dy * R.keras_depthwise(x2, w, **kw)), np.sum(dx * x2))
    assert np.isclose(np.sum(dy * R.keras_depthwise(x, w2, **kw)), np.sum(dw * w2))


# ------------------------------------------------------------------ parser

@pytest.mark.parametrize("command, options", [
    (None, ["info", "check", "bench", "--version"]),
    ("info", []),
    ("check", ["--device", "--dtype", "--op", "--rank", "--layout", "--seed",
               "--failures-only"]),
    ("bench", ["--quick", "--peers", "--json"]),
])
def test_help(command, options, capsys):
    argv = ([command] if command else []) + ["--help"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: numbasep")
    for opt in options:
        assert opt in out


@pytest.mark.parametrize("argv", [["frobnicate"], [], ["check", "--no-such-option"],
                                  ["check", "--device", "tpu"], ["info", "extra"]])
def test_usage_errors_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    assert "usage: numbasep" in capsys.readouterr().err


def test_bench_is_delegated(monkeypatch):
    from numbasep import bench
    seen = {}

    def fake_run(args):
        seen["args"] = args
        return 0

    monkeypatch.setattr(bench, "run", fake_run)
    assert cli.main(["bench", "--quick", "--no-bandwidth"]) == 0
    assert seen["args"].quick and seen["args"].no_bandwidth


def test_python_dash_m_and_lazy_imports():
    code = ("import sys; from numbasep.__main__ import main; "
            "rc = main(['check', '--help']); "
            "assert rc == 0, rc; "
            "assert 'numbasep.bench' not in sys.modules; "
            "assert 'numba.cuda' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "numbasep", "--version"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"numbasep {numbasep.__version__}"
    r = subprocess.run([sys.executable, "-m", "numbasep", "nope"], capture_output=True)
    assert r.returncode == 2

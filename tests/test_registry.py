"""The backend registry: classification by type, memoised, import-free; clear errors."""

import os
import subprocess
import sys

import numpy as np
import pytest

import numbasep
from numbasep import backends


class CAIOnly:
    """Any object with ``__cuda_array_interface__`` on its type (never called here)."""

    @property
    def __cuda_array_interface__(self):
        raise AssertionError("classification must not read the interface")


class FakeSimArray:
    __cuda_ndarray__ = True


@pytest.fixture
def registry_state():
    """Snapshot and restore the registry's tables around a test that changes them."""
    saved = (list(backends._registry), dict(backends._by_type), dict(backends._loaded))
    yield
    backends._registry[:] = saved[0]
    backends._by_type.clear()
    backends._by_type.update(saved[1])
    backends._by_types.clear()
    backends._loaded.clear()
    backends._loaded.update(saved[2])


def test_numpy_and_python_values_are_cpu():
    assert backends.backend_name(np.zeros(3)) == "cpu"
    assert backends.backend_name(np.float32(1)) == "cpu"
    assert backends.backend_name([1.0, 2.0]) == "cpu"
    be, (x,) = backends.select(x=np.zeros(3))
    assert be.name == "cpu" and isinstance(x, np.ndarray)


def test_cuda_array_types_are_cuda():
    assert backends.backend_name(CAIOnly()) == "cuda"
    assert backends.backend_name(FakeSimArray()) == "cuda"


def test_numba_device_arrays_are_cuda():
    cuda = pytest.importorskip("numba.cuda")
    assert backends.backend_name(cuda.to_device(np.zeros(3))) == "cuda"


def test_unknown_type_names_the_argument():
    x = np.ones((1, 4, 4, 2), np.float32)
    with pytest.raises(TypeError, match=r"filter is a builtins\.dict, which no numbasep "
                                        r"backend accepts; supported: NumPy arrays"):
        numbasep.depthwise_conv2d_native(x, {}, [1, 1, 1, 1], "SAME")
    with pytest.raises(TypeError, match=r"kernel is a builtins\.object"):
        numbasep.depthwise_conv(x, object())


def test_mixed_devices_name_every_argument_and_where_it_is():
    x = np.ones((1, 4, 4, 2), np.float32)
    with pytest.raises(TypeError) as e:
        numbasep.separable_conv(x, CAIOnly(), np.ones((1, 1, 2, 3), np.float32))
    msg = str(e.value)
    assert "all array arguments must live on one device" in msg
    assert "inputs (numpy.ndarray) on cpu" in msg
    assert "depthwise_kernel (test_registry.CAIOnly) on cuda" in msg
    assert "pointwise_kernel (numpy.ndarray) on cpu" in msg


def test_mixed_with_a_torch_cpu_tensor_explains_it():
    cls = type("Tensor", (CAIOnly,), {"__module__": "torch", "device": "cpu"})
    with pytest.raises(TypeError, match=r"filter \(torch\.Tensor on device cpu\) on cuda.*"
                                        r"PyTorch CPU tensors .*tensor\.numpy\(\)"):
        numbasep.depthwise_conv2d_native(np.ones((1, 4, 4, 2), np.float32), cls(),
                                         [1, 1, 1, 1], "SAME")


def test_classification_is_memoised_per_type(registry_state):
    calls = []

    class Probe:
        pass

    def owns(t):
        calls.append(t)
        return t is Probe

    backends.register("probe", owns, "no.such.module", first=True)
    assert backends.backend_name(Probe()) == "probe"
    assert backends.backend_name(Probe()) == "probe"
    assert backends.backend_name(np.zeros(2)) == "cpu"
    assert backends.backend_name(np.ones(5)) == "cpu"
    assert calls == [Probe, np.ndarray]     # once per type
    assert backends._by_type[Probe] == "probe"


def test_register_replaces_and_orders(registry_state):
    backends.register("probe", lambda t: False, "no.such.module")
    assert backends.names()[-1] == "probe"
    backends.register("probe", lambda t: False, "no.such.module", first=True)
    assert backends.names()[0] == "probe" and backends.names().count("probe") == 1
    with pytest.raises(KeyError, match="no backend named 'nope'"):
        backends.get("nope")


def _run(code, **env_extra):
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


HEAVY = "('numba.cuda', 'numba_cuda', 'cupy', 'torch', 'jax')"


def test_classification_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from numbasep import backends\n"
        "class CAI:\n"
        "    @property\n"
        "    def __cuda_array_interface__(self): raise AssertionError\n"
        "Cupy = type('ndarray', (CAI,), {'__module__': 'cupy._core.core'})\n"
        "Torch = type('Tensor', (CAI,), {'__module__': 'torch'})\n"
        "import numpy as np\n"
        "names = [backends.backend_name(o) for o in (np.zeros(1), Cupy(), Torch())]\n"
        "assert names == ['cpu', 'cuda', 'cuda'], names\n"
        "try:\n"
        "    backends.select(a=np.zeros(1), b=Cupy())\n"
        "except TypeError:\n"
        "    pass\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY})))\n"
    )
    assert _run(code) == "[]"


def test_cpu_only_call_never_imports_numba_cuda():
    code = (
        "import sys, numpy as np, numbasep\n"
        "x = np.ones((1, 6, 6, 2), np.float32)\n"
        "k = np.ones((3, 3, 2, 1), np.float32)\n"
        "pk = np.ones((1, 1, 2, 3), np.float32)\n"
        "numbasep.depthwise_conv(x, k)\n"
        "numbasep.separable_conv_grad(x, k, pk, np.ones((1, 4, 4, 3), np.float32))\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY})))\n"
    )
    assert _run(code) == "[]"

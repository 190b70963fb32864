"""A new process loads the CPU kernels from Numba's on-disk cache instead of
compiling them again (issue 5: "use Numba's cache so a new process does not
recompile").

The same workload runs in two fresh interpreters one after the other. The first
compiles whatever the cache does not hold yet (in CI most of it is already there:
earlier test modules ran the same kernels); the second must compile nothing: every
numbasep dispatcher it used reports cache hits and no misses. A kernel whose cache
key changes from process to process (for instance because its factory's closure
holds another dispatcher) fails here by name.
"""

import json
import subprocess
import sys

WORKLOAD = r"""
import gc, json
import numpy as np
import ml_dtypes
import numbasep as nb
from numba.core.registry import CPUDispatcher

rng = np.random.default_rng(0)

def run(x_shape, k_shape, dtype, fmt, strides=1, padding="same", m=1):
    x = rng.standard_normal(x_shape).astype(dtype)
    k = rng.standard_normal(k_shape + (m,)).astype(dtype)
    y = nb.depthwise_conv(x, k, strides, padding, fmt)
    nb.depthwise_conv_grad(x, k, np.ones_like(y), strides, padding, fmt)

# one problem per kernel family the CPU driver routes to
run((2, 7, 7, 16), (3, 3, 16), np.float32, "channels_last")        # lanes
run((2, 7, 7, 12), (3, 3, 12), np.float32, "channels_last")        # tiles
run((1, 40, 40, 12), (3, 3, 12), np.float32, "channels_last")      # row kernels (3x3)
run((1, 40, 40, 16), (3, 3, 16), np.float32, "channels_last", 2)   # strided rows, lanes
run((2, 16, 12, 12), (3, 3, 16), np.float32, "channels_first")     # planes / tiles
run((1, 4, 3, 20, 20), (1, 3, 3, 4), np.float32, "channels_first")  # 3-D rows (3x3)
run((1, 3, 20, 20), (2, 2, 3), np.float64, "channels_first", m=2)  # generic rows, M=2
run((1, 9, 9, 8), (3, 3, 8), np.float16, "channels_last")          # float16 bits (lanes)
run((1, 9, 9, 8), (3, 3, 8), ml_dtypes.bfloat16, "channels_last")  # bfloat16 bits (lanes)
run((1, 9, 9, 4), (2, 2, 4), np.float16, "channels_last")          # float16 widening
x = rng.standard_normal((1, 9, 9, 4)).astype(np.float32)
nb.separable_conv_grad(x, rng.standard_normal((3, 3, 4, 2)).astype(np.float32),
                       rng.standard_normal((1, 1, 8, 5)).astype(np.float32),
                       np.ones((1, 9, 9, 5), np.float32), 1, "same")

used = []
for d in gc.get_objects():
    if isinstance(d, CPUDispatcher) and d.py_func.__module__.startswith("numbasep"):
        s = d.stats
        hits, misses = sum(s.cache_hits.values()), sum(s.cache_misses.values())
        if hits or misses:
            used.append([d.py_func.__module__, d.py_func.__qualname__, hits, misses])
print(json.dumps(used))
"""


def _run_workload():
    proc = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_new_process_compiles_nothing_the_cache_holds():
    first = _run_workload()
    second = _run_workload()
    modules = {module for module, _, _, _ in second}
    for family in ("kernels", "lanes", "tiles", "planes", "halves", "groups"):
        assert f"numbasep.backends.cpu.{family}" in modules, (family, sorted(modules))
    names = {name for _, name, _, _ in second}
    # (each factory's kernels named after its key: cache_key.instance)
    assert any(n.startswith("_build.<locals>.forward_cf_") for n in names), names
    assert any(n.startswith("_build.<locals>.forward_cl_") for n in names), names
    assert sorted(map(tuple, second)) and len(second) >= 10, (first, second)
    recompiled = [(m, name, misses) for m, name, _, misses in second if misses]
    assert not recompiled, f"compiled again in a new process: {recompiled}"
    assert all(hits for _, _, hits, _ in second)


CLOSURES = r"""
import sys
import numpy as np
import numbasep as nb
from numbasep.backends.cpu import driver
from numba import typeof, types
real, ran, loading = driver._launch, [], False


def spy(kern, *args):
    if loading and hasattr(kern, "task"):     # only load its code: no address taken
        kern.task.compile((types.int64, types.int64) + tuple(map(typeof, args)))
        return
    ran.append(kern.py_func.__qualname__)
    real(kern, *args)


driver._launch = spy
worst = 0.0
for arg in sys.argv[1:]:
    loading, k = arg.startswith("load"), int(arg[-1])
    rng = np.random.default_rng(k)
    x = rng.standard_normal((2, 5, 6, 2)).astype(np.float32)
    w = rng.standard_normal((k, k, 2, 2)).astype(np.float32)
    y = nb.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "VALID")
    want = np.zeros(y.shape)
    for i in range(k):
        for j in range(k):
            want += np.repeat(x[:, i:i + 6 - k, j:j + 7 - k], 2, axis=3) * w[i, j].reshape(4)
    if not loading:
        worst = max(worst, float(np.abs(y - want).max()))
print(worst, *ran)
"""


def test_kernels_of_one_factory_compiled_in_two_processes_keep_their_own_code(tmp_path):
    # The generic row kernels and the 3x3 ones are closures of one factory
    # (kernels._build). Compiled by two processes in the same order, each got the
    # same symbol name from Numba; a process that loaded both from the cache then
    # ran the first one's code for the second (cache_key.instance).
    import os
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))

    def run(*windows):
        proc = subprocess.run([sys.executable, "-c", CLOSURES, *windows], capture_output=True,
                              text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        worst, *ran = proc.stdout.split()
        return float(worst), ran

    run("3")
    # the helpers cached, the two kernels each the first function its process
    # compiles: the same count in both
    for f in tmp_path.rglob("*forward_cl*"):
        f.unlink()
    second, ran3 = run("3")
    first, ran2 = run("2")
    assert first < 1e-5 and second < 1e-5
    assert "_build.<locals>.forward_cl_0_0" in ran2, ran2     # the generic rows
    assert "_build.<locals>.forward_cl_3_3" in ran3, ran3
    # (load2: the generic kernel's code loaded before the 3x3 one's, its address
    # taken after: Numba looks a symbol up by name)
    for order in (("2", "3"), ("3", "2"), ("load2", "3", "2"), ("load3", "2", "3")):
        worst, _ = run(*order)
        assert worst < 1e-5, (order, worst)


EDITED = r"""
import json, sys
import numpy as np
import numbasep
from numbasep.backends.cpu import kernels
assert numbasep.__file__.startswith(sys.argv[1]), numbasep.__file__
dw = np.zeros((1, 1, 1, 3, 1))
kernels._sum_partials(0, 1, np.ones((2, 1, 1, 1, 3, 1)), dw)
assert (dw == 2).all()
s = kernels._sum_partials.stats
print(json.dumps([sum(s.cache_hits.values()), sum(s.cache_misses.values())]))
"""


def test_an_edit_to_any_kernel_module_invalidates_every_cached_kernel(tmp_path):
    # Numba alone keys an entry on its own file; a kernel inlines its siblings'
    # helpers, so editing one (simd.py here, not kernels.py) must make it compile again
    import os
    import shutil

    import numbasep
    root = tmp_path / "src"
    shutil.copytree(os.path.dirname(numbasep.__file__), root / "numbasep",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run():
        proc = subprocess.run([sys.executable, "-c", EDITED, str(root)], capture_output=True,
                              text=True, timeout=600, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return tuple(json.loads(proc.stdout.strip().splitlines()[-1]))

    assert run() == (0, 1)                   # compiled and saved
    assert run() == (1, 0)                   # unchanged sources: loaded
    with open(root / "numbasep" / "backends" / "cpu" / "simd.py", "a") as f:
        f.write("\n# an edit to a helper module\n")
    assert run() == (0, 1)                   # compiled again
    assert run() == (1, 0)


def test_only_the_kernels_modules_take_the_tree_stamp():
    from numba import njit
    from numba.core import caching

    from numbasep.backends.cpu import cache_key, kernels
    impl = cache_key._impl_class()
    before = list(impl._locator_classes)
    assert cache_key.install() and impl._locator_classes == before     # idempotent
    locator = kernels._sum_partials._cache._impl.locator
    assert isinstance(locator, cache_key._TreeStamp)
    assert locator.get_source_stamp()[1] == cache_key.sources_digest()

    def users_function(a):
        return a + 1

    user = njit(cache=True)(users_function)
    assert not isinstance(user._cache._impl.locator, cache_key._TreeStamp)
    assert isinstance(user._cache._impl.locator, caching._CacheLocator)


def test_the_digest_covers_every_module_of_the_directory(tmp_path):
    from numbasep.backends.cpu import cache_key
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not a module\n")
    first = cache_key.sources_digest(str(tmp_path))
    (tmp_path / "notes.txt").write_text("changed\n")
    assert cache_key.sources_digest(str(tmp_path)) == first
    (tmp_path / "b.py").write_text("y = 3\n")
    assert cache_key.sources_digest(str(tmp_path)) != first
    (tmp_path / "b.py").write_text("y = 2\n")
    assert cache_key.tree_digest(str(tmp_path)) == first

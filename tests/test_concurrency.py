"""Concurrency and determinism: threads, thread counts and repeated calls change no bit.

* Many Python threads calling the same and different operators at once (both
  layouts, four dtypes, with and without ``out=``) get bitwise the results of
  serial calls.
* Another Python thread keeps running while a CPU kernel computes: the kernels
  declare ``nogil=True`` (and Numba's parallel regions run without the GIL under
  the ``omp`` layer in any case), so operators called from several threads
  overlap instead of queueing on the interpreter lock.
* Numba's ``workqueue`` threading layer (its fallback when neither OpenMP nor TBB
  is available) is not thread-safe: two parallel regions entered at once abort the
  process. With GIL-free kernels that is reachable from plain Python threads, so
  concurrent calls must also be safe under ``NUMBA_THREADING_LAYER=workqueue``;
  this runs in a subprocess (tests/_worker.py) so that an abort is reported, not
  fatal.
* Determinism: the same call gives bitwise the same result run after run, and the
  filter gradients (whose reductions are split over threads) are identical with
  ``numba.set_num_threads(1)`` and with more threads, channels-last and
  channels-first, float32 and float64.

CUDA: the same thread and determinism checks run on device arrays (numba's
simulator when there is no GPU: tiny shapes); skipped with the reason when the
backend cannot be loaded.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import ml_dtypes
import numba
import numpy as np
import pytest

import numbasep

import support

BF16 = np.dtype(ml_dtypes.bfloat16)
ONES = [1, 1, 1, 1]


_cuda_missing = support.cuda_missing


needs_cuda = pytest.mark.skipif(bool(_cuda_missing()), reason=str(_cuda_missing()))


def rand(shape, dtype, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def calls(dtype, scale=1):
    """(name, thunk) pairs covering every operator and both layouts."""
    s = scale
    x = rand((2, 9 * s, 8 * s, 3), dtype, 1)
    xc = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    w = rand((3, 3, 3, 2), dtype, 2)
    dy = rand((2, 9 * s, 8 * s, 6), dtype, 3)
    dyc = np.ascontiguousarray(np.moveaxis(dy, -1, 1))
    w52 = rand((5, 2, 3, 1), dtype, 4)
    pk = rand((1, 1, 6, 4), dtype, 5)
    g = rand((2, 9 * s, 8 * s, 4), dtype, 6)
    x1 = rand((2, 17 * s, 3), dtype, 7)
    k1 = rand((3, 3, 2), dtype, 8)
    x3 = rand((1, 4, 5, 6, 2), dtype, 9)
    k3 = rand((2, 2, 3, 2, 1), dtype, 10)
    F, BI, BF = (numbasep.depthwise_conv2d_native,
                 numbasep.depthwise_conv2d_native_backprop_input,
                 numbasep.depthwise_conv2d_native_backprop_filter)
    return [
        ("fwd_nhwc", lambda: F(x, w, ONES, "SAME")),
        ("fwd_nchw", lambda: F(xc, w, ONES, "SAME", data_format="NCHW")),
        ("fwd_5x2_dilated", lambda: F(x, w52, [1, 2, 1, 1], "SAME", dilations=[1, 1, 2, 1])),
        ("bi_nhwc", lambda: BI(list(x.shape), w, dy, ONES, "SAME")),
        ("bi_nchw", lambda: BI(list(xc.shape), w, dyc, ONES, "SAME", data_format="NCHW")),
        ("bf_nhwc", lambda: BF(x, [3, 3, 3, 2], dy, ONES, "SAME")),
        ("bf_nchw", lambda: BF(xc, [3, 3, 3, 2], dyc, ONES, "SAME", data_format="NCHW")),
        ("dc_1d_causal", lambda: numbasep.depthwise_conv(x1, k1, padding="causal",
                                                         dilation_rate=2)),
        ("dc_3d_cf", lambda: numbasep.depthwise_conv(
            np.ascontiguousarray(np.moveaxis(x3, -1, 1)), k3, padding="same",
            data_format="channels_first")),
        ("sc", lambda: numbasep.separable_conv(x, w, pk, padding="same")),
        ("dcg", lambda: numbasep.depthwise_conv_grad(x, w, dy, padding="same")),
        ("scg", lambda: numbasep.separable_conv_grad(x, w, pk, g, padding="same")),
    ]


def as_bytes(result):
    if isinstance(result, tuple):
        return tuple(as_bytes(r) for r in result)
    return (result.shape, result.dtype.str, np.ascontiguousarray(result).tobytes())


def hammer(jobs, threads=8, rounds=3):
    """Run every job ``rounds`` times from ``threads`` threads at once, each thread in
    its own order; return {name: set of result bytes} and the exceptions raised."""
    seen = {name: set() for name, _ in jobs}
    errors = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def work(t):
        order = list(jobs) * rounds
        np.random.default_rng(t).shuffle(order)
        start.wait()
        for name, fn in order:
            try:
                r = as_bytes(fn())
            except Exception as e:  # noqa: BLE001 - collected and reported
                with lock:
                    errors.append((name, repr(e)))
                continue
            with lock:
                seen[name].add(r)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return seen, errors


# ----------------------------------------------------------------- threads

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16],
                         ids=["float32", "float64", "float16", "bfloat16"])
def test_threads_mixed_operators_match_serial_bitwise(dtype):
    jobs = calls(dtype)
    serial = {name: as_bytes(fn()) for name, fn in jobs}
    seen, errors = hammer(jobs, threads=8, rounds=2)
    assert not errors
    for name, results in seen.items():
        assert results == {serial[name]}, f"{name}: a threaded result differs from serial"


def test_threads_same_operator_match_serial_bitwise():
    jobs = [j for j in calls(np.float32, scale=2) if j[0] in ("fwd_nhwc", "bf_nchw", "scg")]
    for job in jobs:
        serial = as_bytes(job[1]())
        seen, errors = hammer([job], threads=12, rounds=4)
        assert not errors
        assert seen[job[0]] == {serial}, job[0]


def test_threads_each_with_its_own_out():
    x = rand((2, 12, 12, 4), np.float32, 1)
    w = rand((3, 3, 4, 1), np.float32, 2)
    want = numbasep.depthwise_conv2d_native(x, w, ONES, "SAME")
    outs = [np.full(want.shape, np.nan, np.float32) for _ in range(8)]
    strided = [np.full(want.shape[:-1] + (8,), np.nan, np.float16)[..., ::2] for _ in range(8)]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                assert numbasep.depthwise_conv2d_native(x, w, ONES, "SAME", out=outs[i]) \
                    is outs[i]
                numbasep.depthwise_conv2d_native(x.astype(np.float16), w.astype(np.float16),
                                                 ONES, "SAME", out=strided[i])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    want16 = numbasep.depthwise_conv2d_native(x.astype(np.float16), w.astype(np.float16),
                                              ONES, "SAME")
    for o, s in zip(outs, strided):
        assert o.tobytes() == want.tobytes()
        assert np.ascontiguousarray(s).tobytes() == want16.tobytes()


# ----------------------------------------------------------------- the GIL

def _kernels():
    from numbasep.backends.cpu import kernels
    ks = kernels.kernel_set(0, 0)
    return [kernels.sum_partials] + [getattr(ks, n) for n in (
        "forward_cl", "forward_cf", "backprop_input_cl", "backprop_input_cf",
        "backprop_filter_cl", "backprop_filter_cf")]


def test_cpu_kernels_declare_nogil():
    """Each kernel's task and the parallel launcher that runs the tasks."""
    from numba import types

    from numbasep.backends.cpu import tasks
    for k in _kernels():
        assert isinstance(k, tasks.Parallel), k
        assert k.task.targetoptions.get("nogil") is True, k.py_func.__name__
    launcher = tasks._launcher(types.none(types.int64, types.int64))
    assert launcher.targetoptions.get("nogil") is True
    assert launcher.targetoptions.get("parallel") is True


def test_cpu_kernels_release_the_gil_while_computing():
    """A Python thread keeps running while a kernel computes.

    A ticker thread records a timestamp every millisecond while the main thread
    makes one call lasting a few hundred milliseconds; the longest pause between
    ticks must stay well below the call's duration (with the GIL held by the
    kernel, the ticker would stop for all of it).
    """
    w = rand((7, 7, 16, 1), np.float32, 2)
    numbasep.depthwise_conv2d_native(rand((1, 8, 8, 16), np.float32, 1), w, ONES, "SAME")
    n = 2
    while True:      # a call long enough to measure, on whatever machine this is
        x = rand((n, 96, 96, 16), np.float32, 1)
        t0 = time.perf_counter()
        numbasep.depthwise_conv2d_native(x, w, ONES, "SAME")
        took = time.perf_counter() - t0
        if took > 0.15 or n >= 128:
            break
        n *= 2
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-3)
    try:
        for attempt in range(6):
            ticks, stop = [], threading.Event()

            def ticker():
                while not stop.is_set():
                    ticks.append(time.perf_counter())
                    time.sleep(1e-3)

            t = threading.Thread(target=ticker)
            t.start()
            time.sleep(0.02)
            t0 = time.perf_counter()
            numbasep.depthwise_conv2d_native(x, w, ONES, "SAME")
            t1 = time.perf_counter()
            stop.set()
            t.join()
            stamps = [t0] + [b for b in ticks if t0 <= b <= t1] + [t1]
            gap = max(b - a for a, b in zip(stamps, stamps[1:]))
            if gap < 0.5 * (t1 - t0):
                return
            if t1 - t0 < 0.05 and n < 128:
                # too short to tell a held GIL from scheduling noise (the sizing
                # call above can be slowed by a busy machine): a bigger call
                n *= 2
                x = rand((n, 96, 96, 16), np.float32, 1)
        raise AssertionError(f"a Python thread was stalled for {gap:.3f} s of a "
                             f"{t1 - t0:.3f} s call: the kernel holds the GIL")
    finally:
        sys.setswitchinterval(old)


_WORKQUEUE_SCRIPT = textwrap.dedent("""
    import threading, numpy as np, numba, numbasep
    x = np.random.default_rng(0).uniform(-1, 1, (2, 24, 24, 4)).astype(np.float32)
    w = np.random.default_rng(1).uniform(-1, 1, (3, 3, 4, 1)).astype(np.float32)
    dy = np.random.default_rng(2).uniform(-1, 1, (2, 24, 24, 4)).astype(np.float32)
    F = lambda: numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
    B = lambda: numbasep.depthwise_conv2d_native_backprop_filter(
        x, [3, 3, 4, 1], dy, [1, 1, 1, 1], "SAME")
    want = (F().tobytes(), B().tobytes())
    assert numba.threading_layer() == "workqueue", numba.threading_layer()
    bad = []
    def work():
        for _ in range(40):
            if (F().tobytes(), B().tobytes()) != want:
                bad.append(1)
    ts = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    print("OK" if not bad else "MISMATCH")
""")


def test_threads_are_safe_with_the_workqueue_threading_layer():
    """Numba's fallback layer aborts the process on concurrent parallel regions."""
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    try:
        p = subprocess.run([sys.executable, "-c", _WORKQUEUE_SCRIPT], env=env,
                           capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise AssertionError("concurrent calls under workqueue hung") from None
    assert p.returncode == 0 and p.stdout.strip() == "OK", (
        f"concurrent calls under NUMBA_THREADING_LAYER=workqueue: exit {p.returncode}\n"
        f"{p.stdout[-2000:]}{p.stderr[-2000:]}")


# ----------------------------------------------------------------- determinism

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16],
                         ids=["float32", "float64", "float16", "bfloat16"])
def test_same_call_same_bits_run_after_run(dtype):
    for name, fn in calls(dtype):
        first = as_bytes(fn())
        for _ in range(4):
            assert as_bytes(fn()) == first, name


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_filter_gradient_independent_of_thread_count(fmt, dtype):
    """The filter gradient's partial sums are split by the problem's shape, never by
    the thread count: 1 thread and every available count give the same bits."""
    cf = fmt == "NCHW"
    # rows (N*OH) and batch large enough that the reduction is split into many chunks
    x = rand((70, 5, 6, 17) if cf else (7, 33, 17, 5), dtype, 1)
    fs = [3, 3, 5, 2]
    g_shape = numbasep.depthwise_conv2d_native(x, rand(fs, dtype, 2), ONES, "SAME",
                                               data_format=fmt).shape
    dy = rand(g_shape, dtype, 3)
    xk = rand((9, 13, 11, 3), dtype, 4)
    k = rand((3, 3, 3, 2), dtype, 5)
    gk = rand((9, 13, 11, 6), dtype, 6)
    old = numba.get_num_threads()
    results = {}
    try:
        for n in sorted({1, 2, numba.config.NUMBA_NUM_THREADS}):
            if n > numba.config.NUMBA_NUM_THREADS:
                continue
            numba.set_num_threads(n)
            dw = numbasep.depthwise_conv2d_native_backprop_filter(
                x, fs, dy, ONES, "SAME", data_format=fmt)
            dk = numbasep.depthwise_conv_grad(
                np.ascontiguousarray(np.moveaxis(xk, -1, 1)) if cf else xk, k,
                np.ascontiguousarray(np.moveaxis(gk, -1, 1)) if cf else gk, padding="same",
                data_format="channels_first" if cf else "channels_last")[1]
            results[n] = (dw.tobytes(), dk.tobytes())
    finally:
        numba.set_num_threads(old)
    assert len(set(results.values())) == 1, f"results differ across thread counts {results.keys()}"


# ----------------------------------------------------------------- CUDA

def _dev(a):
    from numba import cuda
    return cuda.to_device(a)


@needs_cuda
def test_cuda_threads_and_repeats_match_serial_bitwise():
    """Device calls from several Python threads, and repeated calls, give the same bits."""
    x = rand((2, 5, 6, 3), np.float32, 1)
    w = rand((3, 3, 3, 2), np.float32, 2)
    dy = rand((2, 5, 6, 6), np.float32, 3)
    pk = rand((1, 1, 6, 2), np.float32, 4)
    xc = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    dyc = np.ascontiguousarray(np.moveaxis(dy, -1, 1))
    dx_, dw_, ddy, dpk, dxc, ddyc = map(_dev, (x, w, dy, pk, xc, dyc))
    jobs = [
        ("fwd", lambda: numbasep.depthwise_conv2d_native(dx_, dw_, ONES, "SAME")),
        ("bf_cl", lambda: numbasep.depthwise_conv2d_native_backprop_filter(
            dx_, [3, 3, 3, 2], ddy, ONES, "SAME")),
        ("bf_cf", lambda: numbasep.depthwise_conv2d_native_backprop_filter(
            dxc, [3, 3, 3, 2], ddyc, ONES, "SAME", data_format="NCHW")),
        ("sc", lambda: numbasep.separable_conv(dx_, dw_, dpk, padding="same")),
    ]

    def host_bytes(fn):
        r = fn()
        return r.copy_to_host().tobytes()

    serial = {name: host_bytes(fn) for name, fn in jobs}
    for name, fn in jobs:
        assert host_bytes(fn) == serial[name], f"{name}: repeated call differs"
    from numba import cuda
    if cuda.config.ENABLE_CUDASIM:
        pytest.skip("numba's CUDA simulator is not thread-safe (it finds the simulated "
                    "thread's blockIdx/threadIdx through threading.current_thread()): "
                    "concurrent launches are checked on a real GPU only; repeats passed")
    seen, errors = {}, []
    lock = threading.Lock()

    def work(t):
        for name, fn in jobs[t % len(jobs):] + jobs[:t % len(jobs)]:
            try:
                b = host_bytes(fn)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append((name, repr(e)))
                continue
            with lock:
                seen.setdefault(name, set()).add(b)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for name, results in seen.items():
        assert results == {serial[name]}, name

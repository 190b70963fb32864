"""What a small CPU call costs besides its kernels: the full operator call minus the
bare kernel launches it makes, the two timed in alternating rounds in one process.

    python benchmarks/call_overhead.py [--maps 7,14] [--channels 32] [--rounds 40]

N = 1, 3x3 windows, SAME padding, float32, results into ``out=``, 1 thread. The
kernel launches are recorded once by wrapping the CPU driver's ``_launch`` and
then replayed with the same arguments, so "bare" is the compiled kernels alone
(Numba's dispatch and parallel launch included) and the difference is the
Python side: the repeated-call cache lookup, the ``out=`` check, routing and the
operand views. Each figure is the fastest of ``--rounds`` rounds of a hundred
calls (microsecond timings on a shared machine only ever err upwards).
"""

import argparse
import time

import numba
import numpy as np

import numbasep
from numbasep.backends.cpu import driver

OPS = ("forward", "backprop_input", "backprop_filter")


def _call(op, layout, hw, c):
    rng = np.random.default_rng(0)
    shape = (1, hw, hw, c) if layout == "NHWC" else (1, c, hw, hw)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((3, 3, c, 1), dtype=np.float32)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", data_format=layout)
    dy = numbasep.depthwise_conv2d_native(x, w, **attrs)
    if op == "forward":
        out = np.empty_like(dy)
        return lambda: numbasep.depthwise_conv2d_native(x, w, **attrs, out=out)
    if op == "backprop_input":
        out = np.empty_like(x)
        return lambda: numbasep.depthwise_conv2d_native_backprop_input(
            list(shape), w, dy, **attrs, out=out)
    out = np.empty_like(w)
    return lambda: numbasep.depthwise_conv2d_native_backprop_filter(
        x, list(w.shape), dy, **attrs, out=out)


def _launches(full):
    """The kernels ``full`` launches, with their arguments, as one callable."""
    seen = []
    real = driver._launch

    def record(kern, *args):
        seen.append((kern, args))
        return real(kern, *args)
    driver._launch = record
    try:
        full()
    finally:
        driver._launch = real

    def bare():
        for kern, args in seen:
            kern(*args)
    return bare, len(seen)


def _per_call(fn, calls):
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def measure(op, layout, hw, c, rounds, calls=100):
    full = _call(op, layout, hw, c)
    full()
    full()                                  # compiled, cached on the plan
    bare, launches = _launches(full)
    for _ in range(10):
        _per_call(full, calls)
        _per_call(bare, calls)
    a, b = [], []
    for _ in range(rounds):
        a.append(_per_call(full, calls))
        b.append(_per_call(bare, calls))
    return min(a), min(b), launches


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--maps", default="7,14")
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args(argv)
    numba.set_num_threads(1)
    print(f"{'op':16s} {'layout':6s} {'map':>9s} {'full us':>8s} {'bare us':>8s} "
          f"{'overhead':>8s} launches")
    for op in OPS:
        for layout in ("NHWC", "NCHW"):
            for hw in (int(m) for m in args.maps.split(",")):
                full, bare, n = measure(op, layout, hw, args.channels, args.rounds)
                print(f"{op:16s} {layout:6s} {f'{hw}x{hw}x{args.channels}':>9s} {full:8.1f} "
                      f"{bare:8.1f} {full - bare:8.1f} {n:8d}")


if __name__ == "__main__":
    main()

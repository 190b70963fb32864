"""GPU check: agreement and speed of numbasep's CUDA backend on the PERFORMANCE.md suite.

For a machine with an NVIDIA GPU (written for an H200: 4.8 TB/s of HBM). For
each case of :mod:`numbasep.suite` it

1. runs the operator on device arrays and compares the result with the CPU
   backend on the same data (the tolerances of SPEC section 6);
2. times it with CUDA events (warm: compiled, inputs resident, results
   written into preallocated ``out=`` buffers; median of ``--reps`` calls),
   twice: the whole call from an idle stream ("call ms": the host's launch
   work included, what a caller waits for), and the device's work alone ("gpu
   ms": the call queued behind a kernel that sleeps while the host launches);
3. times PyTorch's ``conv2d(groups=C)`` and its backward on the same shape,
   the same two ways, when PyTorch with CUDA is installed;

and prints milliseconds, achieved GB/s (bytes of :func:`numbasep.suite.bytes_moved`,
the each-tensor-once lower bound, over the device time) and the percentage of
the HBM bandwidth; "x torch" is PyTorch's device time over numbasep's (its call
time over numbasep's, marked "c", where a device time could not be isolated).

Usage::

    python benchmarks/gpu_check.py            # the quick subset of the suite
    python benchmarks/gpu_check.py --full     # every row of PERFORMANCE.md
    python benchmarks/gpu_check.py --ptx      # first type-check every kernel as PTX
    python benchmarks/gpu_check.py --tiny     # tiny shapes; runs on numba's CUDA
                                              # simulator when no GPU is present

Nothing heavy is imported at module level (asv scans this folder).
"""

import argparse
import json
import os
import shutil
import sys
import time

HBM_BYTES_PER_S = 4.8e12   # H200
# max |cuda - cpu| / max(1, max |cpu|): SPEC section 6, float32 loosened for the
# large sums of filter gradients.
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 4e-2, "bfloat16": 2e-2}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="Agreement checks and CUDA-event timings of numbasep's CUDA backend "
                    "(and PyTorch, if installed) on the PERFORMANCE.md suite.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true",
                      help="tiny shapes (a smoke test); uses the CUDA simulator when no "
                           "GPU is present")
    size.add_argument("--full", action="store_true", help="every case of the suite")
    p.add_argument("--op", action="append",
                   choices=("forward", "backprop_input", "backprop_filter",
                            "separable_forward", "separable_grad"),
                   help="only these operators (repeatable)")
    p.add_argument("--dtype", action="append",
                   choices=("float32", "float64", "float16", "bfloat16"),
                   help="only these dtypes (repeatable)")
    p.add_argument("--N", type=int, action="append", help="only these batch sizes")
    p.add_argument("--name", help="regular expression on case names")
    p.add_argument("--reps", type=int, default=20, help="timed calls per case (median)")
    p.add_argument("--no-check", action="store_true", help="skip the agreement checks")
    p.add_argument("--no-torch", action="store_true", help="do not time PyTorch")
    p.add_argument("--ptx", action="store_true",
                   help="type-check every kernel by compiling it to PTX first")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return p.parse_args(argv)


def _gpu_present():
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


def _numpy_compat():
    """numba-cuda 0.30 needs ``np.row_stack``, which NumPy 2.5 removed (an alias of vstack)."""
    import numpy as np
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


# ------------------------------------------------------------------------- cases

def tiny_cases(suite):
    """A handful of tiny cases covering every op, layout, rank and dtype path."""
    mk = suite.make_case
    out = []
    for op in ("forward", "backprop_input", "backprop_filter"):
        out += [mk(op, 2, 6, 4, 3, 1), mk(op, 2, 7, 3, 3, 2, layout="NCHW"),
                mk(op, 1, 5, 2, 3, 1, multiplier=2), mk(op, 1, 6, 3, 3, 1, dtype="bfloat16"),
                mk(op, 1, 6, 3, 3, 1, dtype="float16", layout="NCHW"),
                mk(op, 2, (9,), 4, 3, 1), mk(op, 1, (3, 4, 4), 2, 3, 1, layout="channels_first")]
    for op in ("separable_forward", "separable_grad"):
        out += [mk(op, 2, 5, 3, 3, 1, filters=4),
                mk(op, 1, 5, 2, 3, 1, filters=3, layout="NCHW", dtype="bfloat16")]
    return out


def select_cases(suite, args):
    if args.tiny:
        pool = tiny_cases(suite)
    else:
        pool = suite.cases(quick=not args.full)
    keep = []
    import re
    rx = re.compile(args.name) if args.name else None
    for c in pool:
        if args.op and c.op not in args.op:
            continue
        if args.dtype and c.dtype not in args.dtype:
            continue
        if args.N and c.N not in args.N:
            continue
        if rx and not rx.search(c.name):
            continue
        keep.append(c)
    return keep


def make_arrays(suite, case, rng):
    """Random NumPy inputs of ``case``: x, w, and dy / pk as the op needs."""
    rnd = suite._random
    a = {"x": rnd(rng, case.input_shape, case.dtype),
         "w": rnd(rng, case.filter_shape, case.dtype)}
    if case.op in ("backprop_input", "backprop_filter"):
        a["dy"] = rnd(rng, case.output_shape, case.dtype)
    if case.op.startswith("separable"):
        a["pk"] = rnd(rng, case.pointwise_shape, case.dtype)
    if case.op == "separable_grad":
        a["dy"] = rnd(rng, case.separable_output_shape, case.dtype)
    return a


def result_shapes(case):
    return {
        "forward": [case.output_shape],
        "backprop_input": [case.input_shape],
        "backprop_filter": [case.filter_shape],
        "separable_forward": [case.separable_output_shape],
        "separable_grad": [case.input_shape, case.filter_shape, case.pointwise_shape],
    }[case.op]


def call(case, a, out):
    """Run ``case``'s operator on arrays ``a`` (NumPy or CUDA alike) into ``out``.

    2-D depthwise ops go through the TensorFlow-style raw ops; a 1-D case runs
    the 2-D op on a size-1 row; a 3-D gradient calls the backend primitive after
    the public operators' validation (the public N-D gradient returns both).
    """
    import numbasep as nb
    from numbasep import backends, dtypes, shapes

    c, s = case, case.stride
    if c.op == "separable_forward":
        return nb.separable_conv(a["x"], a["w"], a["pk"], s, "same", c.data_format, out=out[0])
    if c.op == "separable_grad":
        return nb.separable_conv_grad(a["x"], a["w"], a["pk"], a["dy"], s, "same",
                                      c.data_format, out=tuple(out))
    if c.ndim == 3:
        x, w = a["x"], a["w"]
        if c.op == "forward":
            return nb.depthwise_conv(x, w, s, "same", c.data_format, out=out[0])
        dy = a["dy"]
        be, (xb, wb, dyb) = backends.select(inputs=x, kernel=w, out_grad=dy)
        plan = shapes.keras(be.shape(xb), be.shape(wb), s, "same", c.data_format, 1,
                            out_grad_shape=be.shape(dyb))
        plan = plan.with_dtype(dtypes.common_dtype(
            [("inputs", be.dtype(xb)), ("kernel", be.dtype(wb)), ("out_grad", be.dtype(dyb))]))
        o = be.check_out(out[0], "out")
        if c.op == "backprop_input":
            return be.depthwise_backprop_input(plan, dyb, wb, o)
        return be.depthwise_backprop_filter(plan, xb, dyb, o)

    def as4(arr):
        # 1-D: a size-1 row of the 2-D op (a free reshape of contiguous arrays).
        if c.ndim == 2 or arr is None:
            return arr
        shp = tuple(arr.shape)
        return arr.reshape((shp[0], 1) + shp[1:] if c.channels_last
                           else shp[:2] + (1,) + shp[2:])

    fmt = "NHWC" if c.channels_last else "NCHW"
    st = [1, s, s, 1] if c.channels_last else [1, 1, s, s]
    if c.ndim == 1:
        st = [1, 1, s, 1] if c.channels_last else [1, 1, 1, s]
    w4 = a["w"] if c.ndim == 2 else a["w"].reshape((1,) + tuple(a["w"].shape))
    o4 = out[0] if c.op == "backprop_filter" and c.ndim == 2 else (
        out[0].reshape((1,) + tuple(out[0].shape)) if c.op == "backprop_filter"
        else as4(out[0]))
    if c.op == "forward":
        return nb.depthwise_conv2d_native(as4(a["x"]), w4, st, "SAME", data_format=fmt, out=o4)
    if c.op == "backprop_input":
        x4 = as4(a["x"])
        return nb.depthwise_conv2d_native_backprop_input(
            list(x4.shape), w4, as4(a["dy"]), st, "SAME", data_format=fmt, out=o4)
    return nb.depthwise_conv2d_native_backprop_filter(
        as4(a["x"]), list(w4.shape), as4(a["dy"]), st, "SAME", data_format=fmt, out=o4)


# ------------------------------------------------------------------------ timing

# The GPU-time measurement queues a kernel that sleeps this long before the timed
# call, so the call's launches are all queued while the device is still busy and
# the events around them measure the device's work alone, not the host's.
_SPIN_NS = 5_000_000


def _spin_kernel(cuda):
    @cuda.jit
    def spin(ns):
        t = 0
        while t < ns:
            cuda.nanosleep(1000)   # sleeps about a microsecond (the hardware's choice)
            t += 1000
    return spin


def _median(times):
    times = sorted(times)
    return times[len(times) // 2], times[0], times[-1]


def _host_timer(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return _median(times)


def _event_timers(new_event, spin):
    """(call time, device time): functions (fn, reps) -> (median, min, max) in ms.

    Each call is bracketed by two events (numba's or PyTorch's, which have the
    same methods) on the default stream, which both libraries share. For the
    call time the stream is idle when the first event is recorded, so the time
    includes the host's work (what a caller waits for). For the device time a
    kernel that sleeps ``_SPIN_NS`` holds the stream while the host queues the
    call, so the events see the device's work alone; that timer returns None
    when the host took longer than the sleep. ``spin`` is :func:`_spin_kernel`'s.
    """
    def timer(fn, reps, busy):
        times = []
        for _ in range(reps):
            if busy:
                spin[1, 1](_SPIN_NS)
            start, stop = new_event(), new_event()
            start.record()
            t0 = time.perf_counter()
            fn()
            host_s = time.perf_counter() - t0
            stop.record()
            stop.synchronize()
            if busy and host_s > 0.8e-9 * _SPIN_NS:
                return None
            times.append(start.elapsed_time(stop))
        return _median(times)
    return (lambda fn, reps: timer(fn, reps, False)), (lambda fn, reps: timer(fn, reps, True))


def torch_peer(case, torch):
    """A callable running PyTorch's nearest equivalent of ``case``, or None.

    2-D only: ``conv2d(groups=C)`` (NHWC cases in ``channels_last`` memory
    format), its backward through ``aten.convolution_backward`` one gradient at
    a time, and for separable ops a depthwise then a 1x1 convolution (the
    gradient through autograd). Padding is symmetric ``k // 2``: the same output
    size and work as SAME, the window shifted by a pixel where SAME is uneven.
    """
    if case.ndim != 2:
        return None
    F = torch.nn.functional
    dt = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}[case.dtype]
    dev = "cuda"
    mf = torch.channels_last if case.channels_last else torch.contiguous_format
    N, C, M = case.N, case.C, case.multiplier
    H, W = case.spatial
    k, s = case.kernel[0], case.stride
    pad = k // 2
    x = torch.randn(N, C, H, W, device=dev, dtype=dt).to(memory_format=mf)
    w = torch.randn(C * M, 1, k, k, device=dev, dtype=dt)
    if case.op == "forward":
        return lambda: F.conv2d(x, w, stride=s, padding=pad, groups=C)
    if case.op in ("backprop_input", "backprop_filter"):
        y = F.conv2d(x, w, stride=s, padding=pad, groups=C)
        dy = torch.randn_like(y).to(memory_format=mf)
        mask = [case.op == "backprop_input", case.op == "backprop_filter", False]
        bw = torch.ops.aten.convolution_backward
        return lambda: bw(dy, x, w, None, [s, s], [pad, pad], [1, 1], False, [0, 0], C, mask)
    pk = torch.randn(case.filters, C * M, 1, 1, device=dev, dtype=dt)
    if case.op == "separable_forward":
        return lambda: F.conv2d(F.conv2d(x, w, stride=s, padding=pad, groups=C), pk)
    xg, wg, pkg = (t.detach().clone().requires_grad_(True) for t in (x, w, pk))
    out_shape = F.conv2d(F.conv2d(x, w, stride=s, padding=pad, groups=C), pk).shape
    dy = torch.randn(out_shape, device=dev, dtype=dt).to(memory_format=mf)

    def grad():
        y = F.conv2d(F.conv2d(xg, wg, stride=s, padding=pad, groups=C), pkg)
        return torch.autograd.grad(y, (xg, wg, pkg), dy)
    return grad


def _import_torch():
    try:
        import torch
    except Exception:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


# -------------------------------------------------------------------------- main

def main(argv=None):
    args = parse_args(argv)
    if args.tiny and not _gpu_present():
        # Before numba is imported anywhere.
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    _numpy_compat()
    if args.ptx:
        import subprocess
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        rc = subprocess.call([sys.executable, "-m", "numbasep.backends.cuda.ptxcheck",
                              "--cc", "9.0"], env=env)
        if rc not in (0, 77):
            print("PTX type check failed", file=sys.stderr)
            return rc

    import numpy as np
    from numba import cuda

    from numbasep import suite
    from numbasep.backends.cuda import transfer

    sim = bool(cuda.config.ENABLE_CUDASIM)
    if sim:
        # The simulator's barriers poll under the GIL; a short switch interval
        # makes block-synchronising kernels several times faster.
        sys.setswitchinterval(1e-4)
        device = "CUDA simulator (timings meaningless)"
        if args.reps > 2:
            args.reps = 2
    else:
        d = cuda.get_current_device()
        device = f"{d.name.decode() if isinstance(d.name, bytes) else d.name} " \
                 f"(cc {d.compute_capability[0]}.{d.compute_capability[1]})"
    torch = None if (args.no_torch or sim) else _import_torch()
    cases = select_cases(suite, args)
    print(f"device: {device}; {len(cases)} cases; torch: "
          f"{torch.__version__ if torch else 'not used'}; warm, median of {args.reps}, "
          f"results into preallocated out= buffers")
    header = (f"{'case':48s} {'check':>9s} {'call ms':>8s} {'gpu ms':>8s} {'GB/s':>7s}"
              f" {'%HBM':>5s}"
              + (f" {'torch ms':>8s} {'gpu ms':>8s} {'x torch':>7s}" if torch else ""))
    print(header)
    spin = None if sim else _spin_kernel(cuda)
    call_timer, gpu_timer = ((_host_timer, lambda fn, reps: None) if sim
                             else _event_timers(cuda.event, spin))
    if torch:
        torch_call, torch_gpu = _event_timers(
            lambda: torch.cuda.Event(enable_timing=True), spin)
    rows = []
    failures = 0
    rng = np.random.default_rng(0)
    for c in cases:
        a = make_arrays(suite, c, rng)
        ad = {k: transfer.to_device(v) for k, v in a.items()}   # bfloat16 too
        outs = [cuda.device_array(shp, suite._np_dtype(c.dtype)) for shp in result_shapes(c)]
        t0 = time.perf_counter()
        res = call(c, ad, outs)
        cuda.synchronize()
        first_s = time.perf_counter() - t0
        row = {"case": c.name, "first_call_s": first_s}
        check = "-"
        if not args.no_check:
            want = call(c, a, [np.empty(shp, suite._np_dtype(c.dtype))
                               for shp in result_shapes(c)])
            got = res if isinstance(res, tuple) else (res,)
            want = want if isinstance(want, tuple) else (want,)
            err = 0.0
            for g, w_ in zip(got, want):
                g64 = np.asarray(g.copy_to_host(), np.float64)
                w64 = np.asarray(w_, np.float64)
                scale = max(1.0, float(np.abs(w64).max()) if w64.size else 1.0)
                err = max(err, float(np.abs(g64 - w64).max()) / scale if w64.size else 0.0)
            ok = err <= TOLERANCE[c.dtype]
            failures += not ok
            check = f"{err:.1e}" + ("" if ok else "!")
            row.update(max_rel_err=err, ok=ok)
        def fn(c=c, ad=ad, outs=outs):
            return call(c, ad, outs)
        med, lo, hi = call_timer(fn, args.reps)
        gpu = gpu_timer(fn, args.reps)
        dev_ms = gpu[0] if gpu else med     # the device's time when it could be isolated
        nbytes = suite.bytes_moved(c)
        gbs = nbytes / (dev_ms * 1e-3) / 1e9 if dev_ms > 0 else float("nan")
        row.update(ms=med, ms_min=lo, ms_max=hi, gpu_ms=gpu and gpu[0],
                   gpu_ms_min=gpu and gpu[1], gpu_ms_max=gpu and gpu[2], bytes=nbytes,
                   flops=suite.flops(c), gb_per_s=gbs, pct_hbm=100 * gbs * 1e9 / HBM_BYTES_PER_S)
        gtxt = f"{gpu[0]:8.3f}" if gpu else f"{'-':>8s}"
        line = (f"{c.name:48s} {check:>9s} {med:8.3f} {gtxt} {gbs:7.1f}"
                f" {row['pct_hbm']:5.1f}")
        if torch:
            tfn = None
            try:
                tfn = torch_peer(c, torch)
            except Exception as e:  # a peer that cannot run this shape is not our failure
                row["torch_error"] = f"{type(e).__name__}: {e}"
            if tfn is not None:
                tfn()
                torch.cuda.synchronize()
                tmed = torch_call(tfn, args.reps)[0]
                tgpu = torch_gpu(tfn, args.reps)
                row.update(torch_ms=tmed, torch_gpu_ms=tgpu and tgpu[0])
                # Device times when both were isolated, else call times (marked "c").
                if tgpu and gpu:
                    rtxt = f"{tgpu[0] / gpu[0]:7.2f}"
                else:
                    rtxt = f"{tmed / med:6.2f}c"
                ttxt = f"{tgpu[0]:8.3f}" if tgpu else f"{'-':>8s}"
                line += f" {tmed:8.3f} {ttxt} {rtxt}"
        print(line, flush=True)
        rows.append(row)
        del ad, outs, res, fn   # the device memory goes before the next case's
    print(f"{failures} agreement failure(s)" if not args.no_check else "agreement not checked")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``numbasep`` command line: ``info``, ``check`` and ``bench``.

Run it as ``python -m numbasep <command>`` or, once installed, ``numbasep <command>``;
``--help`` on any command lists its options. Exit status: 0 when the command
succeeded, 1 when ``check`` found a wrong result, 2 for a usage error (unknown
command or option, or a device that is not there).

From Python, ``main(["check", "--device", "cpu"])`` runs a command and returns its
exit status (it never raises ``SystemExit``).
"""

import argparse
import os
import sys
import time

import numpy as np

import numbasep

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

DTYPES = ("float16", "bfloat16", "float32", "float64")
#: Tolerances (atol = rtol) against the float64 reference; TensorFlow's own test values.
TOLERANCES = {"float16": 4e-2, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}
RAW_OPS = ("depthwise_conv2d_native", "depthwise_conv2d_native_backprop_input",
           "depthwise_conv2d_native_backprop_filter")
KERAS_OPS = ("depthwise_conv", "separable_conv", "depthwise_conv_grad", "separable_conv_grad")
LAYOUTS = ("channels_last", "channels_first")

#: The operators ``check`` calls, looked up at call time (tests replace entries).
OPERATORS = {name: getattr(numbasep, name) for name in RAW_OPS + KERAS_OPS}


# ============================================================================ helpers

def _dist_version(dist):
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _import_cuda():
    """``numba.cuda``, after the backend's NumPy compatibility fix (numba-cuda 0.30)."""
    try:
        from .backends.cuda import numpy_compat
        numpy_compat()
    except Exception:
        pass
    from numba import cuda
    return cuda


def cuda_status():
    """Describe the CUDA target without ever raising.

    Returns
    -------
    usable : bool
        True when a real GPU can run the CUDA backend.
    description : str
        The device, or why there is none.
    simulator : bool
        True when numba's CUDA simulator is switched on (``NUMBA_ENABLE_CUDASIM=1``).
    """
    if _dist_version("numba-cuda") is None:
        return False, "none (numba-cuda is not installed: pip install 'numbasep[cuda]')", False
    try:
        from numba import config as nconfig
        if getattr(nconfig, "ENABLE_CUDASIM", 0):
            return False, "none (numba's CUDA simulator is on: NUMBA_ENABLE_CUDASIM=1)", True
        cuda = _import_cuda()
        if not cuda.is_available():
            return False, "none (no CUDA driver or GPU found)", False
        names = []
        for gpu in cuda.gpus:
            with gpu:
                dev = cuda.get_current_device()
                name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                cc = ".".join(map(str, dev.compute_capability))
                names.append(f"[{dev.id}] {name} (compute capability {cc})")
        return True, "; ".join(names) or "a CUDA device", False
    except Exception as e:  # a broken driver or toolkit must not crash `info`
        return False, f"none ({type(e).__name__}: {e})", False


def _threading():
    """Initialise Numba's threading layer with a tiny parallel function; report it."""
    import numba

    @numba.njit(parallel=True, cache=False)
    def _touch(n):
        acc = 0.0
        for i in numba.prange(n):
            acc += i
        return acc

    try:
        _touch(8)
        layer = numba.threading_layer()
    except Exception as e:  # e.g. a requested layer that is not installed
        layer = f"unavailable ({type(e).__name__}: {e})"
    return layer, numba.get_num_threads()


def cache_location():
    """Where Numba keeps numbasep's compiled CPU kernels (they use ``cache=True``)."""
    from numba import config as nconfig
    path = None
    try:
        from .backends.cpu import kernels
        for obj in vars(kernels).values():  # any module-level cached dispatcher will do
            cache = getattr(obj, "_cache", None)
            if getattr(cache, "cache_path", None):
                path = cache.cache_path
                break
    except Exception:
        pass
    if path is None:
        path = nconfig.CACHE_DIR or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "backends", "cpu", "__pycache__")
    if nconfig.CACHE_DIR:
        return f"{path} (NUMBA_CACHE_DIR={nconfig.CACHE_DIR})"
    return f"{path} (set NUMBA_CACHE_DIR to move it)"


# ============================================================================ info

def cmd_info(args):
    import numba
    rows = [
        ("numbasep", numbasep.__version__),
        ("python", sys.version.split()[0]),
        ("numba", numba.__version__),
        ("numpy", np.__version__),
        ("ml_dtypes", _dist_version("ml_dtypes") or "not installed"),
        ("numba-cuda", _dist_version("numba-cuda") or "not installed"),
    ]
    layer, threads = _threading()
    rows += [
        ("threading layer", f"{layer} (requested: {numba.config.THREADING_LAYER})"),
        ("threads", f"{threads} (NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS})"),
        ("cuda device", cuda_status()[1]),
        ("compile cache", cache_location()),
        ("image_data_format", numbasep.config.image_data_format()),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return EXIT_OK


# ============================================================================ check

# Small problems that still exercise strides, dilations, depth multipliers and every
# padding mode. Per rank (channels-last view): spatial sizes S, kernel K, strides s,
# dilations r, depth multiplier M. 2-D uses the common 3x3 filter with M = 1 (the
# CPU backend's unrolled kernels); the other ranks and the raw ops (3x2, M = 2) take
# the generic kernels.
_GEOMETRY = {
    1: dict(S=(11,), K=(4,), s=(2,), r=(2,), M=2),
    2: dict(S=(9, 8), K=(3, 3), s=(2, 1), r=(1, 2), M=1),
    3: dict(S=(5, 6, 4), K=(2, 3, 2), s=(1, 2, 1), r=(2, 1, 1), M=2),
}
_PADDING = {  # operator -> padding for rank 1, 2, 3
    "depthwise_conv": ("causal", "same", "same"),
    "depthwise_conv_grad": ("same", "valid", "valid"),
    "separable_conv": ("valid", "same", "same"),
    "separable_conv_grad": ("causal", "same", "valid"),
}
_N, _C, _F = 2, 3, 4


class _Case:
    """One row of the table: how to call the operator and what it must return."""

    def __init__(self, op, rank, layout, arrays, invoke, expect):
        self.op, self.rank, self.layout = op, rank, layout
        self.arrays = arrays      # float64 inputs, cast to the dtype under test
        self.invoke = invoke      # invoke(fn, arrays) -> result (array or tuple)
        self.expect = expect      # expect(arrays as float64) -> tuple of float64 arrays


def _keras_case(op, rank, layout, rng):
    from . import _reference as R
    g = _GEOMETRY[rank]
    cf = layout == "channels_first"
    padding = _PADDING[op][rank - 1]
    kw = dict(strides=g["s"], padding=padding, data_format=layout, dilation_rate=g["r"])
    x_last = rng.uniform(-1, 1, (_N, *g["S"], _C))
    x = R.to_first(x_last) if cf else x_last
    x = np.ascontiguousarray(x)
    m = g["M"]
    dk = rng.uniform(-1, 1, (*g["K"], _C, m))
    out_sizes = [R.keras_geometry(*a, padding)[0] for a in zip(g["S"], g["K"], g["s"], g["r"])]

    def grad_of(channels):
        dy = rng.uniform(-1, 1, (_N, *out_sizes, channels))
        return np.ascontiguousarray(R.to_first(dy) if cf else dy)

    args = dict(strides=g["s"], padding=padding, channels_first=cf, dilations=g["r"])
    if op == "depthwise_conv":
        return _Case(op, rank, layout, [x, dk],
                     lambda fn, a: fn(a[0], a[1], **kw),
                     lambda a: (R.keras_depthwise(a[0], a[1], **args),))
    if op == "depthwise_conv_grad":
        return _Case(op, rank, layout, [x, dk, grad_of(_C * m)],
                     lambda fn, a: fn(a[0], a[1], a[2], **kw),
                     lambda a: R.keras_depthwise_grad(a[0], a[1], a[2], **args))
    pk = rng.uniform(-1, 1, ((1,) * rank + (_C * m, _F)))
    if op == "separable_conv":
        return _Case(op, rank, layout, [x, dk, pk],
                     lambda fn, a: fn(a[0], a[1], a[2], **kw),
                     lambda a: (R.keras_separable(a[0], a[1], a[2], **args),))
    return _Case(op, rank, layout, [x, dk, pk, grad_of(_F)],
                 lambda fn, a: fn(a[0], a[1], a[2], a[3], **kw),
                 lambda a: R.keras_separable_grad(a[0], a[1], a[2], a[3], **args))


def _raw_case(op, layout, rng):
    from . import _reference as R
    cf = layout == "channels_first"
    fmt = "NCHW" if cf else "NHWC"

    def order(h, w):  # a per-dimension attribute in data_format order
        return [1, 1, h, w] if cf else [1, h, w, 1]

    x_last = rng.uniform(-1, 1, (_N, 7, 6, _C))
    x = np.ascontiguousarray(R.to_first(x_last) if cf else x_last)
    w = rng.uniform(-1, 1, (3, 2, _C, 2))
    if op == "depthwise_conv2d_native":
        kw = dict(strides=order(2, 1), padding="SAME", data_format=fmt, dilations=order(1, 2))
        return _Case(op, 2, fmt, [x, w],
                     lambda fn, a: fn(a[0], a[1], **kw),
                     lambda a: (R.raw_forward(a[0], a[1], **kw),))
    if op == "depthwise_conv2d_native_backprop_input":
        pads = [0, 0, 0, 0, 1, 2, 0, 3] if cf else [0, 0, 1, 2, 0, 3, 0, 0]
        kw = dict(strides=order(1, 2), padding="EXPLICIT", explicit_paddings=pads,
                  data_format=fmt, dilations=order(1, 1))
        dy = R.raw_forward(x, w, **kw)  # only its shape matters
        dy = rng.uniform(-1, 1, dy.shape)
        sizes = list(x.shape)
        return _Case(op, 2, fmt, [w, dy],
                     lambda fn, a: fn(sizes, a[0], a[1], **kw),
                     lambda a: (R.raw_backprop_input(sizes, a[0], a[1], **kw),))
    kw = dict(strides=order(2, 2), padding="VALID", data_format=fmt, dilations=order(2, 1))
    dy = rng.uniform(-1, 1, R.raw_forward(x, w, **kw).shape)
    sizes = list(w.shape)
    return _Case(op, 2, fmt, [x, dy],
                 lambda fn, a: fn(a[0], sizes, a[1], **kw),
                 lambda a: (R.raw_backprop_filter(a[0], sizes, a[1], **kw),))


def _cases(ops, ranks, layouts, seed):
    """The selected cases; each draws its inputs from its own stream, so a case's
    data does not depend on which other cases were selected."""
    order = RAW_OPS + KERAS_OPS
    for op in sorted(set(ops), key=order.index):
        for layout in LAYOUTS:
            if layout not in layouts:
                continue
            key = [seed, order.index(op), LAYOUTS.index(layout)]
            if op in RAW_OPS:
                if 2 in ranks:
                    yield _raw_case(op, layout, np.random.default_rng(key))
                continue
            for rank in ranks:
                yield _keras_case(op, rank, layout, np.random.default_rng(key + [rank]))


class _Device:
    def __init__(self, name):
        self.name = name
        self.cuda = None
        if name == "cuda":
            self.cuda = _import_cuda()

    def put(self, a):
        if self.cuda is None:
            return a
        from .backends.cuda import transfer   # bfloat16 too, which numba-cuda cannot copy
        return transfer.to_device(a)

    def is_native(self, r):
        if self.cuda is None:
            return isinstance(r, np.ndarray)
        t = type(r)
        return hasattr(t, "__cuda_array_interface__") or hasattr(t, "__cuda_ndarray__")

    def get(self, r):
        return r if self.cuda is None else r.copy_to_host()


def _run_case(case, device, dtype_name):
    """Return (max error, problem or None) for one case on one device and dtype."""
    dtype = _numpy_dtype(dtype_name)
    cast = [a.astype(dtype) for a in case.arrays]
    # The reference sees exactly the rounded inputs the operator sees.
    expected = case.expect([c.astype(np.float64) for c in cast])
    result = case.invoke(OPERATORS[case.op], [device.put(c) for c in cast])
    results = result if isinstance(result, tuple) else (result,)
    if len(results) != len(expected):
        return float("nan"), f"returned {len(results)} arrays, expected {len(expected)}"
    from ._reference import max_error
    worst = 0.0
    for i, (got, ref) in enumerate(zip(results, expected)):
        if not device.is_native(got):
            return float("nan"), (f"result {i} is a {type(got).__name__}, not a "
                                  f"{'device' if device.cuda else 'NumPy'} array")
        got = device.get(got)
        if tuple(got.shape) != ref.shape:
            return float("nan"), f"result {i} has shape {tuple(got.shape)}, expected {ref.shape}"
        if got.dtype != dtype:
            return float("nan"), f"result {i} has dtype {got.dtype}, expected {dtype}"
        worst = max(worst, max_error(got, ref))
    return worst, None


def _available_devices():
    usable, _, _ = cuda_status()
    return ["cpu", "cuda"] if usable else ["cpu"]


def cmd_check(args):
    ops = args.op or list(RAW_OPS + KERAS_OPS)
    dtypes_ = sorted(set(args.dtype or DTYPES), key=DTYPES.index)
    ranks = sorted(set(args.rank or [1, 2, 3]))
    layouts = args.layout or list(LAYOUTS)
    if args.device == "all":
        devices = _available_devices()
    elif args.device == "cuda":
        usable, desc, simulator = cuda_status()
        if not (usable or simulator):
            print(f"numbasep check: no CUDA device: {desc}", file=sys.stderr)
            return EXIT_USAGE
        devices = ["cuda"]
    else:
        devices = ["cpu"]

    cases = list(_cases(ops, ranks, layouts, args.seed))
    if not cases:
        print("numbasep check: nothing to check (raw ops are 2-D only: add --rank 2)",
              file=sys.stderr)
        return EXIT_USAGE
    print(f"numbasep {numbasep.__version__} self-test: {len(cases) * len(dtypes_)} cases "
          f"per device on {', '.join(devices)}; error = max |got - ref| / (1 + |ref|) "
          f"against a float64 reference.")
    print("Kernels compile on first use (the CPU kernels are then cached on disk): "
          "the first run takes a few minutes, later ones seconds.", flush=True)

    header = ("operator", "device", "dtype", "layout", "rank", "max error", "tolerance",
              "status")
    widths = (39, 6, 8, 14, 4, 9, 9, 6)
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header))
    print(fmt.format(*("-" * w for w in widths)), flush=True)

    failures, errors = [], []
    start = time.perf_counter()
    for dev_name in devices:
        device = _Device(dev_name)
        for case in cases:
            for dt in dtypes_:
                tol = TOLERANCES[dt]
                try:
                    err, problem = _run_case(case, device, dt)
                except Exception as e:  # report and carry on: the table is the answer
                    err, problem = float("nan"), f"{type(e).__name__}: {e}"
                if problem is not None:
                    status = "ERROR"
                    errors.append((case, dev_name, dt, problem))
                elif not err <= tol:
                    status = "FAIL"
                    failures.append((case, dev_name, dt, err))
                else:
                    status = "ok"
                if status != "ok" or not args.failures_only:
                    print(fmt.format(case.op, dev_name, dt, case.layout, case.rank,
                                     f"{err:.2e}", f"{tol:.0e}", status), flush=True)
    elapsed = time.perf_counter() - start
    total = len(cases) * len(dtypes_) * len(devices)
    for case, dev_name, dt, problem in errors:
        print(f"ERROR {case.op} [{dev_name}, {dt}, {case.layout}, rank {case.rank}]: {problem}")
    bad = len(failures) + len(errors)
    print(f"{total - bad} of {total} passed, {len(failures)} failed, {len(errors)} errors "
          f"({elapsed:.1f} s).")
    return EXIT_FAILED if bad else EXIT_OK


# ============================================================================ parser

def _wants_bench(argv):
    """True when the command line selects ``bench`` (its module is imported only then)."""
    for token in argv:
        if not token.startswith("-"):
            return token == "bench"
    return False


def build_parser(argv=()):
    parser = argparse.ArgumentParser(
        prog="numbasep",
        description="Numba-compiled depthwise and separable convolutions: "
                    "environment report, self-test and benchmarks.",
        epilog="Exit status: 0 success, 1 a check failed, 2 usage error.")
    parser.add_argument("--version", action="version", version=f"numbasep {numbasep.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{info,check,bench}", required=True)

    p = sub.add_parser(
        "info", help="versions, threading layer, CUDA device and compile cache",
        description="Print the versions of numbasep and its dependencies, Numba's threading "
                    "layer and thread count, the CUDA device (if any) and where Numba caches "
                    "compiled kernels.")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "check", help="self-test every operator against a float64 reference",
        description="Run every public operator on small random inputs (1-D, 2-D and 3-D, both "
                    "layouts, float16/bfloat16/float32/float64) and compare it with a float64 "
                    "reference. The first run compiles the kernels.",
        epilog="Exit status: 0 all passed, 1 a result was wrong or an operator raised, "
               "2 usage error (e.g. --device cuda without a GPU).")
    p.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                   help="where to run: cpu, cuda, or all available devices (default: all)")
    p.add_argument("--dtype", action="append", choices=DTYPES,
                   help="dtype to test; repeat for several (default: all four)")
    p.add_argument("--op", action="append", choices=RAW_OPS + KERAS_OPS, metavar="OP",
                   help="operator to test; repeat for several (default: all seven): "
                        + ", ".join(RAW_OPS + KERAS_OPS))
    p.add_argument("--rank", action="append", type=int, choices=(1, 2, 3),
                   help="spatial rank to test; repeat for several (default: 1, 2 and 3; "
                        "the raw TensorFlow ops run for rank 2 only)")
    p.add_argument("--layout", action="append", choices=LAYOUTS,
                   help="data layout; repeat for several (default: both; NHWC/NCHW for the "
                        "raw ops)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs (default: 0)")
    p.add_argument("--failures-only", action="store_true",
                   help="print only the rows that did not pass, and the summary")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "bench", help="time the operators (and, with --peers, other libraries)",
        description="Benchmark numbasep's operators on the shapes real networks use.")
    if _wants_bench(argv):
        from numbasep import bench
        bench.configure_parser(p)
        p.set_defaults(func=lambda args: bench.run(args))
    return parser


def main(argv=None):
    """Run the command line; return the exit status (never raises ``SystemExit``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        code = e.code
        return code if isinstance(code, int) else (EXIT_OK if code is None else EXIT_USAGE)
    code = args.func(args)
    return EXIT_OK if code is None else int(code)


if __name__ == "__main__":
    sys.exit(main())

"""Type-check every CUDA kernel by compiling it to PTX, with or without a GPU.

The CUDA simulator runs kernels as Python and checks no types, so a kernel
can pass every simulated test and still fail to compile for a device. This
module compiles each kernel for the argument types the driver really launches
it with (``cuda.compile_ptx``), which needs the CUDA toolkit's NVVM (the
``numba-cuda[cu12]`` wheels) but no GPU and no driver.

Run it in a process where the simulator is off::

    python -m numbasep.backends.cuda.ptxcheck [--cc 9.0] [--quick]

It prints one line per kernel and signature, and exits with 0 when all
compiled, 1 when one failed, 77 when no toolkit is available (the exit code
test harnesses use for "skipped").
"""

import argparse
import sys
import time

SKIP = 77


def _allow_device_functions_without_gpu(cc):
    """Let device functions compile when no GPU is present.

    numba-cuda 0.30 compiles a kernel's device functions for the *current
    device's* compute capability, even inside ``compile_ptx``, and fails when
    there is no driver. For a type check, pretend the current device has the
    capability asked for.
    """
    import types as pytypes

    from numba import cuda
    import numba.cuda.dispatcher as dispatcher

    try:
        available = cuda.is_available()
    except Exception:
        available = False
    if not available:
        dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(
            compute_capability=tuple(cc))


def signatures(quick=False):
    """``(label, kernel, argument types)`` for every launch the driver makes.

    Parameters
    ----------
    quick : bool
        Only float32 and the bfloat16 mixes (the two paths of the codecs).
    """
    from numba.cuda import types

    from . import kernels

    f16, f32, f64, u16, i64 = (types.float16, types.float32, types.float64, types.uint16,
                               types.int64)
    # Storage type of each plan dtype as the kernels see it (bfloat16 as its bits).
    plan_types = {"float32": f32, "bfloat16": u16, "float16": f16, "float64": f64}
    if quick:
        plan_types = {k: plan_types[k] for k in ("float32", "bfloat16")}

    def arr(t, nd, layout="C"):
        return types.Array(t, nd, layout)

    def kind(t):
        return {f16: "f32", f32: "f32", f64: "f64", u16: "bf16"}[t]

    def okind(t):
        return "bf16" if t == u16 else "num"

    params = (i64,) * 9
    out = []
    for dname, d in plan_types.items():
        a = f64 if d == f64 else f32   # accumulator / wide type
        for layout in ("cl", "cf"):
            for ins, o in (((d, d), d), ((d, d), a)):
                k = kernels.depthwise(f"forward_{layout}", tuple(map(kind, ins)), okind(o))
                out.append((f"forward_{layout} {dname} -> {o}", k,
                            (arr(ins[0], 5), arr(ins[1], 5), arr(o, 5)) + params))
            for ins in ((d, d), (a, d)):
                k = kernels.depthwise(f"backprop_input_{layout}", tuple(map(kind, ins)),
                                      okind(d))
                out.append((f"backprop_input_{layout} {ins} -> {d}", k,
                            (arr(ins[0], 5), arr(ins[1], 5), arr(d, 5)) + params))
            for ins in ((d, d), (d, a)):
                k = kernels.depthwise(f"backprop_filter_{layout}", tuple(map(kind, ins)))
                out.append((f"backprop_filter_{layout} {ins}", k,
                            (arr(ins[0], 5), arr(ins[1], 5), arr(a, 3), i64, i64) + params))
        for o in (d, a):
            k = kernels.sum_parts(kind(a), okind(o))
            out.append((f"sum_parts {a} -> {o}", k, (arr(a, 3), arr(o, 2))))
        gemm_uses = (
            # (ta, tb, A, B, C): CL/CF forward, backprop input, backprop filter
            (False, False, a, d, d), (True, False, d, a, d),
            (False, True, d, d, a), (False, False, d, d, a),
            (True, False, a, d, a), (False, True, a, d, a),
        )
        for ta, tb, A, B, C in gemm_uses:
            k = kernels.gemm(ta, tb, kind(A), kind(B), okind(C))
            out.append((f"gemm ta={ta:d} tb={tb:d} {A},{B} -> {C}", k,
                        (arr(A, 3), arr(B, 3), arr(C, 3)) + (i64,) * 5))
    # Strided (non-contiguous) arguments compile to the 'A' layout.
    k = kernels.depthwise("forward_cl", ("f32", "f32"), "num")
    out.append(("forward_cl float32 strided", k,
                (arr(f32, 5, "A"), arr(f32, 5, "A"), arr(f32, 5, "A")) + params))
    return out


def toolkit_available():
    """True when NVVM can be loaded (compile_ptx works without a GPU)."""
    try:
        from numba.cuda.cudadrv import nvvm
        nvvm.NVVM()
        return True
    except Exception:
        return False


def compile_all(cc=(9, 0), quick=False, stream=sys.stdout):
    """Compile every kernel signature to PTX; return the list of failures."""
    from numba import cuda

    _allow_device_functions_without_gpu(cc)
    failures = []
    seen = set()
    for label, kern, sig in signatures(quick):
        key = (id(kern), sig)
        if key in seen:
            continue
        seen.add(key)
        t = time.perf_counter()
        try:
            cuda.compile_ptx(kern.py_func, sig, cc=tuple(cc))
        except Exception as e:  # report every failure, not just the first
            failures.append((label, e))
            print(f"FAIL {label}: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                  file=stream)
        else:
            print(f"ok   {label} ({time.perf_counter() - t:.1f} s)", file=stream)
    return failures


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 (default)")
    p.add_argument("--quick", action="store_true",
                   help="float32 and bfloat16 only (about a third of the signatures)")
    args = p.parse_args(argv)
    from numba.cuda.core import config
    if config.ENABLE_CUDASIM:
        print("the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): nothing to compile")
        return SKIP
    from . import numpy_compat
    numpy_compat()
    if not toolkit_available():
        print("no CUDA toolkit (NVVM) found: pip install numba-cuda[cu12] to type-check")
        return SKIP
    cc = tuple(int(v) for v in args.cc.split("."))
    failures = compile_all(cc, args.quick)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

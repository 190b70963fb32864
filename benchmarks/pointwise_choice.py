"""Which GEMM should do the pointwise (1x1) step of separable_conv: BLAS or Numba?

A standalone script (not an asv suite). For the separable rows of PERFORMANCE.md
(depthwise 3x3, stride 1, SAME, so the pointwise input is ``N x H x W x C``),
it times the pointwise product in float32, channels_last and channels_first,
done two ways on the same preallocated buffers:

* ``blas``  -- ``numpy.matmul`` (what ``numbasep.backends.cpu.driver`` uses):
  ``(N*P, C) @ (C, F)`` for channels_last, ``(F, C) @ (N, C, P)`` for channels_first;
* ``numba`` -- a plain tiled ``@njit(parallel=True)`` GEMM written here (local
  accumulator tiles, vectorised inner loop; no packing, no register blocking).

Each contender runs in its own process (BLAS and Numba thread pools in one
process steal cores from each other), and the processes alternate over rounds,
so that a burst of load on a shared machine does not hit one contender only;
each cell keeps the best of the per-round medians. The table gives ms, the
Numba/BLAS ratio (< 1: Numba faster) and GFLOP/s.

Usage::

    python benchmarks/pointwise_choice.py [--reps 15] [--batches 1 8] [--rounds 2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numba
import numpy as np
from numba import njit, prange

# (name, H=W, C*M, F): the separable rows of PERFORMANCE.md
ROWS = [
    ("MobileNetV2 56x56x144->24", 56, 144, 24),
    ("MobileNetV1 7x7x1024->1024", 7, 1024, 1024),
    ("Xception middle 19x19x728->728", 19, 728, 728),
    ("Xception entry 147x147x64->128", 147, 64, 128),
]

RB, FB = 8, 256   # channels_last tile: 8 rows x up to 256 filters
FT, PB = 8, 256   # channels_first tile: 8 filters x 256 pixels


@njit(parallel=True, cache=True)
def gemm_rows(a, b, c):
    """c[R, F] = a[R, K] @ b[K, F] (channels_last).

    One task per tile of RB rows x FB filters, accumulated in a local tile over
    the whole reduction and stored once; the inner loop runs over contiguous
    filters and vectorises.
    """
    R, K = a.shape
    F = b.shape[1]
    fbs = F if F < FB else FB
    nrb = (R + RB - 1) // RB
    nfb = (F + fbs - 1) // fbs
    for job in prange(nrb * nfb):
        rb = job // nfb
        fb = job - rb * nfb
        r0 = rb * RB
        r1 = min(R, r0 + RB)
        f0 = fb * fbs
        f1 = min(F, f0 + fbs)
        nf = f1 - f0
        acc = np.zeros((RB, fbs), c.dtype)
        for k in range(K):
            brow = b[k, f0:f1]
            for i in range(r1 - r0):
                av = a[r0 + i, k]
                ai = acc[i]
                for f in range(nf):
                    ai[f] += av * brow[f]
        for i in range(r1 - r0):
            c[r0 + i, f0:f1] = acc[i, :nf]


@njit(parallel=True, cache=True)
def gemm_planes(b, a, c):
    """c[n, F, P] = b[K, F].T @ a[n, K, P] (channels_first).

    One task per (image, FT filters, PB pixels) tile, accumulated locally; the
    inner loop runs over contiguous pixels and vectorises.
    """
    N, K, P = a.shape
    F = b.shape[1]
    npb = (P + PB - 1) // PB
    nfb = (F + FT - 1) // FT
    for job in prange(N * nfb * npb):
        n = job // (nfb * npb)
        rest = job - n * nfb * npb
        fb = rest // npb
        pb = rest - fb * npb
        f0 = fb * FT
        f1 = min(F, f0 + FT)
        p0 = pb * PB
        p1 = min(P, p0 + PB)
        npx = p1 - p0
        acc = np.zeros((FT, PB), c.dtype)
        for k in range(K):
            arow = a[n, k, p0:p1]
            for i in range(f1 - f0):
                w = b[k, f0 + i]
                ai = acc[i]
                for p in range(npx):
                    ai[p] += w * arow[p]
        for i in range(f1 - f0):
            c[n, f0 + i, p0:p1] = acc[i, :npx]


def make_case(rng, hw, k, f, n, layout):
    p = hw * hw
    pk = rng.standard_normal((k, f)).astype(np.float32)
    if layout == "channels_last":
        z = rng.standard_normal((n * p, k)).astype(np.float32)
        out = np.empty((n * p, f), np.float32)
    else:
        z = rng.standard_normal((n, k, p)).astype(np.float32)
        out = np.empty((n, f, p), np.float32)
    return z, pk, out


def runner(contender, layout, z, pk, out):
    if contender == "blas":
        if layout == "channels_last":
            return lambda: np.matmul(z, pk, out=out)
        pkt = pk.T
        return lambda: np.matmul(pkt, z, out=out)
    if layout == "channels_last":
        return lambda: gemm_rows(z, pk, out)
    return lambda: gemm_planes(pk, z, out)


def worker(contender, batches, reps, budget):
    """Time every cell for one contender (in its own process); return JSON-able rows."""
    rng = np.random.default_rng(0)
    rows = []
    for name, hw, k, f in ROWS:
        for n in batches:
            for layout in ("channels_last", "channels_first"):
                z, pk, out = make_case(rng, hw, k, f, n, layout)
                run = runner(contender, layout, z, pk, out)
                run()  # compile (numba) / warm up
                if contender == "numba":  # the kernel must compute the right thing
                    want = z @ pk if layout == "channels_last" else np.matmul(pk.T, z)
                    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3 * np.sqrt(k))
                times = []
                start = time.perf_counter()
                for i in range(reps):
                    t = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - t)
                    if i >= 4 and time.perf_counter() - start > budget:
                        break
                rows.append(dict(name=name, n=n, layout=layout, median=statistics.median(times),
                                 lo=min(times), hi=max(times), reps=len(times),
                                 flops=2.0 * n * hw * hw * k * f))
    layer = numba.threading_layer() if contender == "numba" else "-"
    return dict(rows=rows, layer=layer, threads=numba.get_num_threads())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="maximum repeats per cell")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per cell (soft)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for both BLAS and Numba")
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating blas/numba process rounds; the best median is kept")
    ap.add_argument("--worker", choices=["blas", "numba"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args.batches, args.reps, args.budget)))
        return

    # One process per contender (BLAS and Numba thread pools in one process
    # steal cores from each other), alternated over rounds.
    results = {"blas": [], "numba": []}
    for rnd in range(args.rounds):
        for contender in ("blas", "numba"):
            env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads),
                       OMP_NUM_THREADS=str(args.threads),
                       OPENBLAS_NUM_THREADS=str(args.threads if contender == "blas" else 1))
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", contender,
                   "--reps", str(args.reps), "--budget", str(args.budget),
                   "--batches", *map(str, args.batches)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            results[contender].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  round {rnd + 1}: {contender} done", file=sys.stderr, flush=True)

    def best(contender, i):
        runs = [r["rows"][i] for r in results[contender]]
        return min(runs, key=lambda r: r["median"])

    nb = results["numba"][0]
    print(f"numba {numba.__version__} (threading layer {nb['layer']}, {nb['threads']} threads), "
          f"numpy {np.__version__} BLAS ({args.threads} threads), {os.cpu_count()} CPUs; "
          f"float32, warm, preallocated outputs; ms = best over {args.rounds} rounds of the "
          f"median of up to {args.reps} repeats")
    head = ("| shape                          | N | layout         | BLAS ms | Numba ms "
            "| Numba/BLAS | BLAS GFLOP/s | Numba GFLOP/s |")
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for i, row in enumerate(results["blas"][0]["rows"]):
        a, b = best("blas", i), best("numba", i)
        print(f"| {row['name']:31s}| {row['n']} | {row['layout']:15s}| {a['median'] * 1e3:7.3f} "
              f"| {b['median'] * 1e3:8.3f} | {b['median'] / a['median']:10.2f} "
              f"| {row['flops'] / a['median'] / 1e9:12.1f} "
              f"| {row['flops'] / b['median'] / 1e9:13.1f} |")


if __name__ == "__main__":
    main()

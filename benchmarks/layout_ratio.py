"""NCHW time / NHWC time for every 2-D depthwise row of the suite, measured interleaved.

A standalone script (not an asv suite). The two layouts of one case run in the
same process, alternating in short rounds (NHWC then NCHW, then the other way
round), so that load on a shared machine hits both alike; the ratio reported is
the median over rounds of (NCHW round median / NHWC round median), with the
interquartile range of those ratios. Results are written into preallocated
arrays (``out=``), SAME padding; every 2-D depthwise row of the suite (all
depth multipliers and dtypes it has) at the batch sizes asked for.

Usage::

    python benchmarks/layout_ratio.py [--batch 1,8,32] [--threads 1] [--rounds 7] [--case REGEX]
"""

import argparse
import math
import re
import statistics
import time

import numba
import numpy as np

from numbasep import suite


def _median_time(fn, calls):
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _calls_for(fn, budget=0.02):
    t = _median_time(fn, 3)
    return max(3, min(50, int(budget / max(t, 1e-6))))


def measure(case_last, rounds):
    case_first = suite.make_case(case_last.op, case_last.N, case_last.spatial, case_last.C,
                                 case_last.kernel, case_last.stride, case_last.multiplier,
                                 dtype=case_last.dtype, layout="NCHW")
    _, f_last = suite.make_inputs(case_last, 0)
    _, f_first = suite.make_inputs(case_first, 0)
    for f in (f_last, f_first):
        f()                                   # compile / warm up
    calls = _calls_for(f_last)
    t_last, t_first, ratios = [], [], []
    for r in range(rounds):
        pair = (f_last, f_first) if r % 2 == 0 else (f_first, f_last)
        got = {id(f): _median_time(f, calls) for f in pair}
        t_last.append(got[id(f_last)])
        t_first.append(got[id(f_first)])
        ratios.append(got[id(f_first)] / got[id(f_last)])
    q = np.percentile(ratios, [25, 75])
    return statistics.median(t_last), statistics.median(t_first), statistics.median(ratios), q


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--case", default=None, help="keep cases whose name matches this regex")
    args = ap.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch.split(",")]
    rows = [c for c in suite.cases(N=batches, layout="NHWC", op=list(suite.DEPTHWISE_OPS))
            if c.ndim == 2 and (args.case is None or re.search(args.case, c.name))]
    print(f"# {len(rows)} cases, N={batches}, threads={numba.get_num_threads()}, "
          f"layer={numba.threading_layer() if rows else '-'}; times in ms (median)")
    print(f"{'case':48s} {'NHWC':>8s} {'NCHW':>8s} {'ratio':>6s}  IQR")
    ratios = []
    for c in rows:
        tl, tf, ratio, (q1, q3) = measure(c, args.rounds)
        ratios.append(ratio)
        print(f"{c.name:48s} {tl * 1e3:8.3f} {tf * 1e3:8.3f} {ratio:6.2f}  {q1:.2f}-{q3:.2f}",
              flush=True)
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"# geometric mean {gm:.2f}, max {max(ratios):.2f}, "
              f"within 2x: {sum(r <= 2 for r in ratios)}/{len(ratios)}, "
              f"within 1.3x: {sum(r <= 1.3 for r in ratios)}/{len(ratios)}")


if __name__ == "__main__":
    main()

"""How long the first calls take with an empty Numba cache: one problem of each
CPU kernel family, compiled in this process into a new, empty cache folder.

    python benchmarks/cold_compile.py

Each line is one problem: its first forward call, then its first input and
filter gradients together (``depthwise_conv_grad``). The problems are those of
tests/test_disk_cache.py (2-D, both layouts, float32 and float16, depth
multiplier 2). asv's ``timeraw_`` benchmarks (bench_startup.py) time a cold
import and first call on their own; this script shows where the compiling goes.
"""

import os
import tempfile
import time

PROBLEMS = (
    # label, input shape, filter shape (KH, KW, C), dtype, layout, stride, multiplier
    ("lanes 3x3", (2, 7, 7, 16), (3, 3, 16), "float32", "channels_last", 1, 1),
    ("rows + tiles (gradient)", (2, 7, 7, 12), (3, 3, 12), "float32", "channels_last", 1, 1),
    ("row kernels 3x3", (1, 40, 40, 12), (3, 3, 12), "float32", "channels_last", 1, 1),
    ("lanes, stride 2", (1, 40, 40, 16), (3, 3, 16), "float32", "channels_last", 2, 1),
    ("tiles, channels-first", (2, 16, 12, 12), (3, 3, 16), "float32", "channels_first", 1, 1),
    ("planes 5x5 stride 2", (2, 16, 30, 30), (5, 5, 16), "float32", "channels_first", 2, 1),
    ("lanes float16", (1, 9, 9, 8), (3, 3, 8), "float16", "channels_last", 1, 1),
    ("lanes 5x5, multiplier 2", (2, 12, 12, 16), (5, 5, 16), "float32", "channels_last", 1, 2),
)


def main():
    # set before Numba is imported: it reads the variable once
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numbasep-cold-")
    import numpy as np

    import numbasep
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    print(f"{'problem':26s} {'forward s':>10s} {'gradients s':>12s}")
    for label, xs, ks, dtype, layout, stride, m in PROBLEMS:
        x = rng.standard_normal(xs).astype(dtype)
        k = rng.standard_normal(ks + (m,)).astype(dtype)
        t0 = time.perf_counter()
        y = numbasep.depthwise_conv(x, k, stride, "same", layout)
        t1 = time.perf_counter()
        numbasep.depthwise_conv_grad(x, k, np.ones_like(y), stride, "same", layout)
        t2 = time.perf_counter()
        print(f"{label:26s} {t1 - t0:10.1f} {t2 - t1:12.1f}", flush=True)
    print(f"{'all':26s} {time.perf_counter() - start:23.1f}")


if __name__ == "__main__":
    main()

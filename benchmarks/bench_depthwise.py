"""asv: 2-D depthwise forward and gradients over the suite's shapes, dtypes and layouts.

The time is one call writing into preallocated results (``out=``), compiled in
``setup``. ``Bandwidth.track_gbps`` reports the bandwidth achieved (bytes of
:func:`numbasep.suite.bytes_moved` over the best of five calls) for float32 NHWC.
"""

import time

from numbasep import suite

from . import _cases


class Depthwise2D:
    params = [list(_cases.SHAPES_2D), list(suite.DEPTHWISE_OPS), ["float32", "float16", "bfloat16"],
              ["NHWC", "NCHW"]]
    param_names = ["case", "op", "dtype", "layout"]
    timeout = 300

    def setup(self, key, op, dtype, layout):
        self.case, self.arrays, self.fn = _cases.build(op, key, dtype, layout)

    def time_call(self, key, op, dtype, layout):
        self.fn()


class Bandwidth:
    params = [list(_cases.SHAPES_2D), list(suite.DEPTHWISE_OPS)]
    param_names = ["case", "op"]
    timeout = 300

    def setup(self, key, op):
        self.case, _, self.fn = _cases.build(op, key)

    def track_gbps(self, key, op):
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            self.fn()
            best = min(best, time.perf_counter() - t)
        return suite.bytes_moved(self.case) / best / 1e9

    track_gbps.unit = "GB/s"


class DepthwiseFresh:
    """The same calls allocating their results (page faults of a fresh output included)."""

    params = [list(_cases.SHAPES_2D[:1]), list(suite.DEPTHWISE_OPS)]
    param_names = ["case", "op"]
    timeout = 300

    def setup(self, key, op):
        case, _, fn = _cases.build(op, key)
        _, self.fn = suite.make_inputs(case, 0, out=False)

    def time_call(self, key, op):
        self.fn()

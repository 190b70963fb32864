"""asv: small calls, where validation, dispatch and the parallel launch dominate.

N = 1 on 7x7 and 14x14 maps, with few (32) and many (576) channels, through the
TensorFlow-style raw ops and through the Keras-style ``depthwise_conv``.
"""

import numpy as np

import numbasep
from numbasep import suite


class SmallCall:
    params = [[7, 14], [32, 576], list(suite.DEPTHWISE_OPS) + ["keras_forward"]]
    param_names = ["hw", "C", "op"]

    def setup(self, hw, c, op):
        if op == "keras_forward":
            rng = np.random.default_rng(0)
            x = rng.standard_normal((1, hw, hw, c), dtype=np.float32)
            w = rng.standard_normal((3, 3, c, 1), dtype=np.float32)
            out = np.empty_like(x)

            def fn():
                return numbasep.depthwise_conv(x, w, 1, "same", "channels_last", out=out)
            self.fn = fn
        else:
            case = suite.make_case(op, 1, hw, c, 3, 1)
            _, self.fn = suite.make_inputs(case, 0)
        self.fn()

    def time_call(self, hw, c, op):
        self.fn()

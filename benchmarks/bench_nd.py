"""asv: 1-D and 3-D depthwise convolutions (the Keras-style N-D path).

1-D ``(N, L=1024, C=512, k=5)`` runs by default; the 3-D shapes of
PERFORMANCE.md (``(1, 64, 15x75x315)`` and ``(8, 192, 16x56x56)``, up to 300 MB
per tensor) only with ``NUMBASEP_ASV_FULL=1``.
"""

from numbasep import suite

from . import _cases

_KEYS = ["8x1024x512/k5s1"]
if _cases.FULL:
    _KEYS += ["1x1024x512/k5s1", "32x1024x512/k5s1", "1x15x75x315x64/k3s1",
              "8x16x56x56x192/k3s1"]


def _build(key, op, layout):
    n, rest = key.split("x", 1)
    dims, ks = rest.split("/")
    sizes = tuple(int(v) for v in dims.split("x"))
    k, s = (int(v) for v in ks[1:].split("s"))
    case = suite.make_case(op, int(n), sizes[:-1], sizes[-1], k, s, layout=layout)
    arrays, fn = suite.make_inputs(case, 0)
    fn()
    return fn


class DepthwiseND:
    params = [_KEYS, list(suite.DEPTHWISE_OPS), ["channels_last", "channels_first"]]
    param_names = ["case", "op", "layout"]
    timeout = 600

    def setup(self, key, op, layout):
        self.fn = _build(key, op, layout)

    def time_call(self, key, op, layout):
        self.fn()

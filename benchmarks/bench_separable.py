"""asv: separable convolution (depthwise 3x3, then pointwise to F), forward and gradient."""

from numbasep import suite

from . import _cases

_DEFAULT = ["56x56x144/k3s1/N8:24", "19x19x728/k3s1/N8:728"]
_ALL = [f"{_cases.shape_key(hw, c, 3, 1, n)}:{f}"
        for _, hw, c, f in suite.SEPARABLE_SHAPES for n in suite.BATCHES]


class Separable:
    params = [_ALL if _cases.FULL else _DEFAULT, ["separable_forward", "separable_grad"]]
    param_names = ["case", "op"]
    timeout = 600

    def setup(self, key, op):
        shape, f = key.split(":")
        _, _, self.fn = _cases.build(op, shape, filters=int(f))

    def time_call(self, key, op):
        self.fn()

"""numbasep: depthwise and separable convolutions, forward and gradients, on CPU and CUDA.

The operators take NumPy arrays (computed by Numba on the CPU) or CUDA arrays
(computed on the GPU) and return the same kind of array. Importing the package
compiles nothing and does not import the CUDA target.
"""

from .backends import cpu as _cpu  # noqa: F401  (first: its OpenMP default must precede Numba's)
from . import config, raw_ops
from .aligned import empty_aligned
from .errors import InvalidArgumentError
from .ops import (
    depthwise_conv,
    depthwise_conv2d_native,
    depthwise_conv2d_native_backprop_filter,
    depthwise_conv2d_native_backprop_input,
    depthwise_conv_grad,
    separable_conv,
    separable_conv_grad,
)

__version__ = "0.1.0"

__all__ = [
    "InvalidArgumentError",
    "config",
    "empty_aligned",
    "raw_ops",
    "depthwise_conv",
    "depthwise_conv2d_native",
    "depthwise_conv2d_native_backprop_filter",
    "depthwise_conv2d_native_backprop_input",
    "depthwise_conv_grad",
    "separable_conv",
    "separable_conv_grad",
]

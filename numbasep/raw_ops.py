"""TensorFlow's raw-op names, so code written against ``tf.raw_ops`` ports by changing the import.

Arguments are keyword-only, named as in ``tf.raw_ops``; ``name=`` is accepted and
ignored.

Examples
--------
>>> import numpy as np
>>> from numbasep import raw_ops
>>> x = np.ones((1, 3, 3, 1), np.float32)
>>> w = np.ones((2, 2, 1, 1), np.float32)
>>> raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 1, 1],
...                               padding="VALID").shape
(1, 2, 2, 1)
"""

from . import ops


def DepthwiseConv2dNative(*, input, filter, strides, padding, explicit_paddings=(),
                          data_format="NHWC", dilations=(1, 1, 1, 1), name=None):
    """``tf.raw_ops.DepthwiseConv2dNative``: see :func:`numbasep.depthwise_conv2d_native`."""
    return ops.depthwise_conv2d_native(input, filter, strides, padding, explicit_paddings,
                                       data_format, dilations)


def DepthwiseConv2dNativeBackpropInput(*, input_sizes, filter, out_backprop, strides, padding,
                                       explicit_paddings=(), data_format="NHWC",
                                       dilations=(1, 1, 1, 1), name=None):
    """``tf.raw_ops.DepthwiseConv2dNativeBackpropInput``, with dilations honoured.

    See :func:`numbasep.depthwise_conv2d_native_backprop_input`.
    """
    return ops.depthwise_conv2d_native_backprop_input(
        input_sizes, filter, out_backprop, strides, padding, explicit_paddings, data_format,
        dilations)


def DepthwiseConv2dNativeBackpropFilter(*, input, filter_sizes, out_backprop, strides, padding,
                                        explicit_paddings=(), data_format="NHWC",
                                        dilations=(1, 1, 1, 1), name=None):
    """``tf.raw_ops.DepthwiseConv2dNativeBackpropFilter``, with dilations honoured.

    See :func:`numbasep.depthwise_conv2d_native_backprop_filter`.
    """
    return ops.depthwise_conv2d_native_backprop_filter(
        input, filter_sizes, out_backprop, strides, padding, explicit_paddings, data_format,
        dilations)

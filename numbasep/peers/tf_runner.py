"""TensorFlow peer: ``tf.raw_ops.DepthwiseConv2dNative*`` and ``tf.nn.separable_conv2d``.

Run by :mod:`numbasep.peers.driver` in its own process (protocol in
``_harness.py``). ``TF_ENABLE_ONEDNN_OPTS`` chooses the kernel: ``1`` (TF's
default on x86) uses oneDNN, ``0`` TensorFlow's own Eigen-based kernels. Ops run
eagerly, as a user calling ``tf.raw_ops`` would. 1-D cases run as 2-D with a
size-1 row; TensorFlow has no 3-D depthwise op.
"""

import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __package__:                      # imported as numbasep.peers.<runner>
    from . import _harness
else:                                # run by path, possibly without numbasep installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _harness  # noqa: E402


def load(threads):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0"
    return f"tensorflow {tf.__version__} ({'oneDNN' if onednn else 'Eigen'})", tf


def build(tf, case, rng):
    nd = len(case["spatial"])
    if nd == 3:
        raise NotImplementedError("TensorFlow has no 3-D depthwise convolution")
    if case["op"].startswith("separable") and not case["channels_last"]:
        raise NotImplementedError("tf.nn.separable_conv2d on CPU needs NHWC")
    dt = getattr(tf, case["dtype"])
    cl = case["channels_last"]
    fmt = "NHWC" if cl else "NCHW"
    s = case["stride"]

    def ex(shape):  # 1-D as 2-D with a size-1 row
        shape = list(shape)
        if nd == 1:
            shape.insert(1 if cl else 2, 1)
        return shape

    def arr(shape):
        return tf.cast(tf.constant(_harness.random_array(rng, shape)), dt)

    x = arr(ex(case["input_shape"]))
    w = arr(([1] if nd == 1 else []) + list(case["filter_shape"]))
    # A 1-D case's size-1 row takes the same stride (harmless: its output is 1
    # either way), since TensorFlow wants equal row and column strides.
    st = [1, s, s, 1] if cl else [1, 1, s, s]
    op = case["op"]
    if op == "forward":
        def fn():
            return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=st,
                                                    padding="SAME", data_format=fmt)
    elif op == "backprop_input":
        dy = arr(ex(case["output_shape"]))
        sizes = tf.constant(ex(case["input_shape"]), tf.int32)

        def fn():
            return tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
                input_sizes=sizes, filter=w, out_backprop=dy, strides=st, padding="SAME",
                data_format=fmt)
    elif op == "backprop_filter":
        dy = arr(ex(case["output_shape"]))
        fsizes = tf.constant(list(w.shape), tf.int32)

        def fn():
            return tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
                input=x, filter_sizes=fsizes, out_backprop=dy, strides=st, padding="SAME",
                data_format=fmt)
    else:
        pk = arr(([1] if nd == 1 else []) + list(case["pointwise_shape"]))

        def fwd(x, w, pk):
            return tf.nn.separable_conv2d(x, w, pk, strides=st, padding="SAME",
                                          data_format=fmt)
        if op == "separable_forward":
            def fn():
                return fwd(x, w, pk)
        else:
            dy = arr(ex(case["separable_output_shape"]))

            def fn():
                with tf.GradientTape() as tape:
                    tape.watch([x, w, pk])
                    y = fwd(x, w, pk)
                return tape.gradient(y, [x, w, pk], output_gradients=dy)
    try:
        fn()
    except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError,
            tf.errors.NotFoundError) as e:
        msg = re.sub(r"\{\{.*?\}\}|\[Op:.*?\]", "", str(e)).strip().splitlines()[0]
        raise NotImplementedError(msg[:300]) from None
    return fn


if __name__ == "__main__":
    sys.exit(_harness.main("tf", load, build))

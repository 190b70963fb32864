"""JAX peer: ``lax.conv_general_dilated(feature_group_count=C)`` and its VJP, jitted.

Run by :mod:`numbasep.peers.driver` in its own process (protocol in
``_harness.py``). Every call is ``jax.jit``-compiled once (in the warm-up) and
timed up to ``block_until_ready()``. SAME padding is passed as explicit
``(before, after)`` pairs, so the computation is exactly numbasep's. XLA's CPU
thread pool is sized from the process's CPU affinity, which the harness restricts
to the requested thread count.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __package__:                      # imported as numbasep.peers.<runner>
    from . import _harness
else:                                # run by path, possibly without numbasep installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _harness  # noqa: E402


def load(threads):
    import jax
    jax.config.update("jax_enable_x64", True)
    import jaxlib
    return f"jax {jax.__version__} (jaxlib {jaxlib.__version__})", jax


_SPATIAL = {1: "W", 2: "HW", 3: "DHW"}


def build(jax, case, rng):
    import jax.numpy as jnp
    from jax import lax
    nd = len(case["spatial"])
    cl = case["channels_last"]
    sp = _SPATIAL[nd]
    act = f"N{sp}C" if cl else f"NC{sp}"
    dn = (act, f"{sp}IO", act)
    C, M = case["C"], case["multiplier"]
    dt = jnp.dtype(case["dtype"])
    s = case["stride"]
    strides = (s,) * nd
    pads = [tuple(p) for p in case["pads"]]

    def arr(shape):
        return jnp.asarray(_harness.random_array(rng, shape)).astype(dt)

    x = arr(case["input_shape"])
    k = tuple(case["kernel"])
    w = arr(case["filter_shape"]).reshape(*k, 1, C * M)        # (*K, 1, C*M): index c*M+m

    def dw(x, w):
        return lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=dn,
                                        feature_group_count=C)
    op = case["op"]
    if op == "forward":
        f = jax.jit(dw)
        args = (x, w)
    elif op == "backprop_input":
        dy = arr(case["output_shape"])
        f = jax.jit(lambda x, w, dy: jax.vjp(lambda x_: dw(x_, w), x)[1](dy)[0])
        args = (x, w, dy)
    elif op == "backprop_filter":
        dy = arr(case["output_shape"])
        f = jax.jit(lambda x, w, dy: jax.vjp(lambda w_: dw(x, w_), w)[1](dy)[0])
        args = (x, w, dy)
    else:
        pk = arr(case["pointwise_shape"]).reshape((1,) * nd + (C * M, case["filters"]))
        dn_pk = (act, f"{sp}IO", act)

        def sep(x, w, pk):
            return lax.conv_general_dilated(dw(x, w), pk, (1,) * nd, [(0, 0)] * nd,
                                            dimension_numbers=dn_pk)
        if op == "separable_forward":
            f = jax.jit(sep)
            args = (x, w, pk)
        else:
            dy = arr(case["separable_output_shape"])
            f = jax.jit(lambda x, w, pk, dy: jax.vjp(sep, x, w, pk)[1](dy))
            args = (x, w, pk, dy)

    def fn():
        return jax.block_until_ready(f(*args))
    fn()
    return fn


if __name__ == "__main__":
    sys.exit(_harness.main("jax", load, build))

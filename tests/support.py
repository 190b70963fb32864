"""Helpers shared by several test modules (imported as ``support``, like ``reference``)."""

import numba
import numpy as np

import numbasep


def route_afresh(monkeypatch):
    """Make the CPU driver decide each call's kernel again instead of reusing the
    decision kept on the plan or bound to a repeated call, so that a test's patched
    routing functions apply (and its spies see every decision)."""
    from numbasep import ops
    from numbasep.backends.cpu import driver
    monkeypatch.setattr(driver, "_route", lambda plan, name, decide: decide(plan))
    monkeypatch.setattr(driver, "_direct", lambda *args: None)
    monkeypatch.setattr(ops, "_FAST", {})


def record_routing(monkeypatch, name):
    """Record the decisions of the CPU driver's routing predicate ``name`` (each
    call's, decided afresh: :func:`route_afresh`); returns the list they go to."""
    from numbasep.backends.cpu import driver
    seen = []
    real = getattr(driver, name)

    def spy(plan, *args):
        ok = real(plan, *args)
        seen.append(ok)
        return ok
    monkeypatch.setattr(driver, name, spy)
    route_afresh(monkeypatch)
    return seen


def cuda_missing():
    """None when the CUDA backend loads (a GPU or numba's simulator), else why not."""
    try:
        numbasep.backends.get("cuda")
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        return f"CUDA backend not available: {type(e).__name__}: {e}"
    return None


def refuse_bfloat16_buffers(monkeypatch):
    """Make copies between host and device refuse bfloat16 host buffers, as on a GPU.

    On a device, numba-cuda hands the host array of ``cuda.to_device(a)`` and of
    ``d.copy_to_host(ary)`` to the buffer protocol, which has no type code for
    bfloat16 ("cannot include dtype 'E' in a buffer"); ``d.copy_to_host()`` copies
    into a byte buffer and works. The simulator copies with NumPy and accepts
    everything: with this stand-in a copy that would fail on a GPU fails here too.
    """
    from numba import cuda

    def refuse(a):
        if a is not None and np.asarray(a).dtype.name == "bfloat16":
            raise ValueError("cannot include dtype 'E' in a buffer")

    real_to_device = cuda.to_device

    def to_device(a, *args, **kwargs):
        refuse(a)
        return real_to_device(a, *args, **kwargs)

    device_type = type(real_to_device(np.zeros(1, np.float32)))
    real_copy_to_host = device_type.copy_to_host

    def copy_to_host(self, ary=None, *args, **kwargs):
        refuse(ary)
        return real_copy_to_host(self, ary, *args, **kwargs)

    monkeypatch.setattr(cuda, "to_device", to_device)
    monkeypatch.setattr(device_type, "copy_to_host", copy_to_host)


def channels_first_vs_last(x, w, dy, attrs, last):
    """The three raw ops on channels-first ``x``/``dy`` under ``attrs``, each paired
    with the same op on the channels-last copies under ``last``, moved back."""
    F = numbasep.depthwise_conv2d_native
    BI = numbasep.depthwise_conv2d_native_backprop_input
    BF = numbasep.depthwise_conv2d_native_backprop_filter
    xl, dyl = np.moveaxis(x, 1, -1), np.moveaxis(dy, 1, -1)
    return [(F(x, w, **attrs), np.moveaxis(F(xl, w, **last), -1, 1)),
            (BI(list(x.shape), w, dy, **attrs),
             np.moveaxis(BI(list(xl.shape), w, dyl, **last), -1, 1)),
            (BF(x, list(w.shape), dy, **attrs), BF(xl, list(w.shape), dyl, **last))]


def assert_same_non_finite_pattern(pairs):
    """Each (got, want): NaN and Inf in the same places, finite values close."""
    for got, want in pairs:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        ok = np.isfinite(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-4)


def bytes_per_thread_count(call):
    """The distinct results (as bytes) of ``call()`` with 1 thread and with all."""
    old = numba.get_num_threads()
    got = set()
    try:
        for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(n)
            got.add(call().tobytes())
    finally:
        numba.set_num_threads(old)
    return got


def assert_three_ops_match_the_reference(xs, fs, attrs, dtype):
    """Random x, w, dy of ``dtype`` (seeded by the problem); the three raw ops
    against the float64 reference, within the dtype's tolerance per tap."""
    import reference as R
    F = numbasep.depthwise_conv2d_native
    BI = numbasep.depthwise_conv2d_native_backprop_input
    BF = numbasep.depthwise_conv2d_native_backprop_filter
    rng = np.random.default_rng(abs(hash((xs, fs, str(attrs)))) % 2**32)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(fs).astype(dtype)
    y = F(x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(dtype)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for got, want in ((y, R.raw_forward(x64, w64, **attrs)),
                      (BI(list(xs), w, dy, **attrs),
                       R.raw_backprop_input(list(xs), w64, dy64, **attrs)),
                      (BF(x, list(fs), dy, **attrs),
                       R.raw_backprop_filter(x64, list(fs), dy64, **attrs))):
        scale = 1.0 + np.abs(want).max(initial=0.0)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale * max(fs[0] * fs[1], 1))


def written_in_place(shape, dtype, write):
    """``write(y)`` into a NaN-filled ``y`` of ``shape`` inside a larger buffer;
    asserts the 32 elements either side untouched and returns ``y``."""
    size = int(np.prod(shape))
    buf = np.full(size + 64, np.nan, dtype)
    y = buf[32:32 + size].reshape(shape)
    write(y)
    assert np.isnan(buf[:32]).all() and np.isnan(buf[32 + size:]).all()
    return y


def correlation_reference(x, w, adjoint, attrs):
    """The float64 reference of an in-place correlation of NCHW ``x`` with taps
    ``w[KH, KW, C]`` (multiplier 1): the forward, or (``adjoint``) the input
    gradient with ``x`` as the output gradient."""
    import reference as R
    w64 = w.astype(np.float64)[..., None]
    if adjoint:
        return R.raw_backprop_input(list(x.shape), w64, x.astype(np.float64), **attrs)
    return R.raw_forward(x.astype(np.float64), w64, **attrs)


def draw_padding(draw, h, w, kh, kw, sh, sw, rh, rw):
    """Draw a raw-op padding (SAME, VALID or EXPLICIT with pads 0-4) for an NCHW
    problem and return its attributes; SAME where the drawn one leaves no output."""
    import reference as R
    from hypothesis import strategies as st
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    ep = []
    if padding == "EXPLICIT":
        ep = [0, 0, 0, 0] + draw(st.lists(st.integers(0, 4), min_size=4, max_size=4))
    attrs = dict(strides=[1, 1, sh, sw], padding=padding, explicit_paddings=ep,
                 data_format="NCHW", dilations=[1, 1, rh, rw])
    out_h = R.tf_output_and_pad(h, kh, sh, rh, padding, tuple(ep[4:6]) or (0, 0))[0]
    out_w = R.tf_output_and_pad(w, kw, sw, rw, padding, tuple(ep[6:8]) or (0, 0))[0]
    if out_h <= 0 or out_w <= 0:
        attrs.update(padding="SAME", explicit_paddings=[])
    return attrs


def pointwise_problem(rng, n, h, w, c, f, dtype, channels_first=False):
    """(plan, z, dout, pk): a 2-D separable plan with a 3x3 depthwise kernel and
    ``c`` -> ``f`` pointwise, with uniform operands for its pointwise primitives
    (the depthwise output ``z``, the output gradient ``dout``, the pointwise
    kernel ``pk``) in ``dtype``, channels-first or channels-last."""
    from numbasep import shapes
    fmt = "channels_first" if channels_first else "channels_last"
    image = (lambda k: (n, k, h, w)) if channels_first else (lambda k: (n, h, w, k))
    plan = shapes.keras(image(c), (3, 3, c, 1), 1, "same", fmt, 1,
                        pointwise_shape=(1, 1, c, f)).with_dtype(np.dtype(dtype))
    z, dout = (rng.uniform(-1, 1, image(k)).astype(dtype) for k in (c, f))
    return plan, z, dout, rng.uniform(-1, 1, (1, 1, c, f)).astype(dtype)

"""What every backend provides, and the compositions built from its primitives.

A backend implements five primitives on its own array type, each taking a
validated :class:`numbasep.shapes.Plan` and an optional preallocated result
(``out``). Array arguments arrive either in ``plan.dtype`` or in its
accumulation dtype (float32 for the 16-bit formats); ``wide=True`` asks for the
result in the accumulation dtype, so that the intermediate of a composition is
rounded only once, at the end. The primitives are:
depthwise forward, input gradient and filter gradient, and the same three for
the pointwise (1x1) step. The separable and gradient
operators are composed here from those primitives; a backend overrides a
composition only where fusing steps pays.
"""


def span(shape, strides, itemsize):
    """[lo, hi): the bytes, relative to its first element, that an array of
    ``shape`` and byte ``strides`` touches (empty for a zero-size array)."""
    if 0 in shape:
        return 0, 0
    lo = sum((s - 1) * st for s, st in zip(shape, strides) if st < 0)
    hi = sum((s - 1) * st for s, st in zip(shape, strides) if st > 0) + itemsize
    return lo, hi


def _address_range(arr):
    """[start, end) absolute addresses ``arr`` spans, from its CUDA or NumPy
    array interface; None when it has neither."""
    for attr in ("__cuda_array_interface__", "__array_interface__"):
        try:
            iface = getattr(arr, attr)
        except (AttributeError, RuntimeError):
            continue
        try:
            shape = tuple(int(s) for s in iface["shape"])
            itemsize = int(iface["typestr"][2:])
            strides = iface.get("strides")
            if strides is None:
                strides, step = [], itemsize
                for s in reversed(shape):
                    strides.insert(0, step)
                    step *= max(s, 1)
            lo, hi = span(shape, strides, itemsize)
            ptr = int(iface["data"][0] or 0)
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        return ptr + lo, ptr + hi
    return None


class Backend:
    """Base class of the backends registered in :mod:`numbasep.backends`."""

    name = None

    # -- arrays -----------------------------------------------------------------
    def prepare(self, obj, argname):
        """Return ``obj`` as this backend's array type without copying data."""
        raise NotImplementedError

    def shape(self, arr):
        return tuple(arr.shape)

    def dtype(self, arr):
        import numpy as np
        return np.dtype(arr.dtype)

    def check_out(self, out, argname):
        """Return a user-supplied result array as this backend's array type."""
        return self.prepare(out, argname)

    def shares_memory(self, a, b):
        """Whether writing array ``a`` could change array ``b``. The default
        compares the address ranges their array interfaces describe (so arrays
        that interleave in one buffer count as sharing); a backend that cannot
        tell answers False."""
        ra, rb = _address_range(a), _address_range(b)
        if ra is None or rb is None:
            return False
        return ra[0] < ra[1] and rb[0] < rb[1] and ra[0] < rb[1] and rb[0] < ra[1]

    def wrap(self, result, like):
        """Return ``result`` as the kind of array the caller passed (``like``)."""
        return result

    def workspace_bytes(self, plan):
        """Bytes of intermediates one primitive on ``plan`` may hold besides its
        result, the partial filters and compute copies of its arguments (which the
        operators' memory check counts itself)."""
        return 0

    def bind(self, method, plan, arrays, out):
        """A callable ``run(*arrays, out)`` computing the primitive ``method`` on
        ``plan``, for the operators' repeated-call path: later calls pass arrays of
        the same types, shapes, strides and dtypes as ``arrays`` and ``out`` (None
        or a checked result array), so a backend may decide once here what does not
        change between such calls. The default decides nothing."""
        primitive = getattr(self, method)
        return lambda *args: primitive(plan, *args)

    # -- primitives ---------------------------------------------------------------
    def depthwise_forward(self, plan, x, w, out=None, wide=False):
        raise NotImplementedError

    def depthwise_backprop_input(self, plan, dy, w, out=None, wide=False):
        raise NotImplementedError

    def depthwise_backprop_filter(self, plan, x, dy, out=None, wide=False):
        raise NotImplementedError

    def pointwise_forward(self, plan, z, pk, out=None, wide=False):
        raise NotImplementedError

    def pointwise_backprop_input(self, plan, dout, pk, out=None, wide=False):
        raise NotImplementedError

    def pointwise_backprop_filter(self, plan, z, dout, out=None, wide=False):
        raise NotImplementedError

    def intermediate(self, plan, which, shape):
        """A buffer for a composition's intermediate ``which`` (0: the depthwise
        output, 1: its gradient), of ``shape`` in the accumulation dtype, which dies
        before the composition returns; or None to let the primitive allocate it.
        Backends that can reuse memory from call to call override this."""
        return None

    # -- compositions -------------------------------------------------------------
    def separable_forward(self, plan, x, dk, pk, out=None):
        z = self.depthwise_forward(plan, x, dk, self.intermediate(plan, 0, plan.output_shape),
                                   wide=True)
        return self.pointwise_forward(plan, z, pk, out)

    def depthwise_grad(self, plan, x, w, dy, dx_out=None, dw_out=None):
        return (self.depthwise_backprop_input(plan, dy, w, dx_out),
                self.depthwise_backprop_filter(plan, x, dy, dw_out))

    def separable_grad(self, plan, x, dk, pk, dout, dx_out=None, ddk_out=None, dpk_out=None):
        z = self.depthwise_forward(plan, x, dk, self.intermediate(plan, 0, plan.output_shape),
                                   wide=True)
        dz = self.pointwise_backprop_input(plan, dout, pk,
                                           self.intermediate(plan, 1, plan.output_shape),
                                           wide=True)
        dx = self.depthwise_backprop_input(plan, dz, dk, dx_out)
        ddk = self.depthwise_backprop_filter(plan, x, dz, ddk_out)
        # last: a backend's GEMM here may leave threads busy that the kernels above
        # would have had to share the cores with (the CPU backend's NumPy BLAS)
        dpk = self.pointwise_backprop_filter(plan, z, dout, dpk_out)
        return dx, ddk, dpk

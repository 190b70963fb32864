"""Host side of the CUDA backend: array conversion, result allocation, launches.

Every array stays on the device: arguments are numba device arrays (or become
views of them without a copy, :meth:`CUDABackend.prepare`), results are
allocated with ``cuda.device_array`` or written into the caller's ``out``, and
nothing is copied to the host on the way.

bfloat16 arrays reach the kernels as ``uint16`` views of their bits (see
:mod:`.kernels`); float16 is handed over as it is. A 16-bit result is rounded
once, by the kernel that writes it; ``wide=True`` results stay in float32.

Launch configuration
--------------------
Element-wise kernels use 1-D blocks of 256 threads (16 on the simulator, whose
threads are OS threads) and grid-stride loops with the grid capped, so one
configuration serves every size. The chunk counts of the two-pass reductions
(filter gradients, pointwise filter gradient) are derived from the problem's
shape only, so a result never depends on the device it ran on.
"""

import ctypes
import math
import sys

import numpy as np
from numba import cuda

from .. import base
from ... import dtypes
from . import kernels

SIMULATOR = kernels.SIMULATOR

if SIMULATOR:
    _BLOCK = 16          # threads per 1-D block
    _MAX_BLOCKS = 4      # grid cap (grid-stride loops do the rest)
    _MAX_GRID_Y = 2
    _TARGET_THREADS = 64       # filter-gradient partial count aims at this many threads
    _TARGET_BLOCKS = 4         # ... and this many blocks for the block-per-element forms
else:
    _BLOCK = 256
    _MAX_BLOCKS = 1 << 16
    _MAX_GRID_Y = 65535
    # An H100/H200 keeps about 270 000 threads resident (132 SMs x 2048).
    _TARGET_THREADS = 1 << 18
    _TARGET_BLOCKS = 2048
_MAX_PARTS = 1 << 26     # elements of a partial-sum buffer (256 MiB of float32)


def _cdiv(a, b):
    return -(-a // b)


def _grid1(total):
    return max(1, min(_cdiv(total, _BLOCK), _MAX_BLOCKS))


def _params(plan):
    return plan.strides + plan.dilations + plan.pads


# ------------------------------------------------------------------ array helpers

def _is_native(obj):
    """True for numba device arrays and the simulator's fake ones."""
    return bool(getattr(type(obj), "__cuda_ndarray__", False))


def _root_module(obj):
    return type(obj).__module__.partition(".")[0]


def _describe(obj):
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _c_contiguous(arr):
    return arr.is_c_contiguous()


def _strides_inserting_ones(shape, strides, new_shape, itemsize):
    """Strides for ``new_shape``, which is ``shape`` with size-1 axes inserted."""
    out = []
    i = 0
    for s in new_shape:
        if i < len(shape) and shape[i] == s:
            out.append(strides[i])
            i += 1
        elif s == 1:
            out.append(itemsize)
        else:
            raise ValueError(f"cannot view shape {tuple(shape)} as {tuple(new_shape)}")
    if i != len(shape):
        raise ValueError(f"cannot view shape {tuple(shape)} as {tuple(new_shape)}")
    return tuple(out)


def _view(arr, shape):
    """``arr`` seen with ``shape`` (the same elements), without copying.

    A C-contiguous array is reshaped; a strided one may only gain size-1 axes
    (the canonical 5-D views of the depthwise kernels never need more).
    """
    shape = tuple(shape)
    if tuple(arr.shape) == shape:
        return arr
    if _c_contiguous(arr) or SIMULATOR:
        # numpy (under the simulator) reshapes strided arrays into views when
        # only size-1 axes are added.
        return arr.reshape(shape)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    strides = _strides_inserting_ones(tuple(arr.shape), tuple(arr.strides), shape,
                                      arr.dtype.itemsize)
    # The same memory pointer with a new descriptor, as DeviceNDArray.reshape
    # itself does for the contiguous case.
    return DeviceNDArray(shape=shape, strides=strides, dtype=arr.dtype, gpu_data=arr.gpu_data)


def _bits(arr):
    """The array the kernels receive: bfloat16 as its uint16 bits, anything else as is."""
    if arr.dtype.name == "bfloat16":
        return arr.view(np.uint16)
    return arr


def _contiguous(arr):
    """``arr`` if C-contiguous, else a C-contiguous device copy (made on the device)."""
    if _c_contiguous(arr):
        return arr
    dst = cuda.device_array(arr.shape, arr.dtype)
    if dst.size:
        # Copy bfloat16 as raw bits: the assignment kernel then needs no
        # bfloat16 arithmetic type.
        if arr.dtype.itemsize == 2:
            dst.view(np.uint16)[:] = arr.view(np.uint16)
        else:
            dst[:] = arr
    return dst


def _zero_if_empty_operand(dst, *operands):
    """Fill ``dst`` with zeros and return True when an operand has no elements.

    Every sum is then empty; launching anyway could loop over the huge other
    dimensions an empty tensor may have (a (2**30, 2**30, 1, 0) input, say).
    """
    if all(a.size for a in operands):
        return False
    if dst.size:
        if dst.dtype.itemsize == 2:
            dst.view(np.uint16)[:] = 0
        else:
            dst[:] = 0
    return True


def _copy_into(dst, src):
    """Device-to-device ``dst[:] = src`` for arrays of one shape and dtype.

    (``[:]``, not ``[...]``: numba's device arrays do not index with Ellipsis.)
    """
    if dst.size:
        if dst.dtype.itemsize == 2:
            dst.view(np.uint16)[:] = src.view(np.uint16)
        else:
            dst[:] = src


def _from_interface(obj, iface):
    """A device array over the memory described by ``iface`` (no copy)."""
    if not SIMULATOR:
        return cuda.from_cuda_array_interface(iface, owner=obj, sync=True)
    return _sim_from_interface(obj, iface)


def _sim_from_interface(obj, iface):
    """Simulator stand-in for ``cuda.from_cuda_array_interface``.

    Simulated device memory is host memory, so the interface's pointer can be
    wrapped by a NumPy array (zero-copy), which the simulator's device array
    wraps in turn.
    """
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    shape = tuple(int(s) for s in iface["shape"])
    dtype = np.dtype(iface["typestr"])
    strides = iface.get("strides")
    if strides is None:
        strides = []
        step = dtype.itemsize
        for s in reversed(shape):
            strides.insert(0, step)
            step *= max(s, 1)
    strides = tuple(int(s) for s in strides)
    ptr = iface["data"][0]
    if math.prod(shape) == 0 or not ptr:
        arr = np.empty(shape, dtype)
    else:
        lo, hi = base.span(shape, strides, dtype.itemsize)
        buf = (ctypes.c_byte * (hi - lo)).from_address(ptr + lo)
        arr = np.ndarray(shape, dtype, buffer=buf, offset=-lo, strides=strides)
    fake = FakeCUDAArray(arr)
    fake._numbasep_owner = obj   # keep the memory's owner alive
    return fake


def _bfloat16_dtype():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


# ----------------------------------------------------------------------- backend

class CUDABackend(base.Backend):
    """Depthwise and separable convolutions on CUDA device arrays."""

    name = "cuda"

    # -- arrays -----------------------------------------------------------------
    def prepare(self, obj, argname):
        """Return ``obj`` as a numba device array, sharing its memory.

        Accepts numba device arrays (and the simulator's), and any object
        exposing ``__cuda_array_interface__`` (CuPy arrays, PyTorch CUDA tensors).

        Raises
        ------
        TypeError
            For a PyTorch tensor that cannot be shared (one that requires grad,
            or one on the CPU), or an object whose interface cannot be read.
        """
        if _is_native(obj):
            return obj
        root = _root_module(obj)
        try:
            iface = obj.__cuda_array_interface__
        except RuntimeError as e:
            # PyTorch raises RuntimeError for tensors that require grad.
            hint = (" Pass tensor.detach() (numbasep returns gradients explicitly "
                    "and does not record an autograd graph)." if root == "torch" else "")
            raise TypeError(
                f"{argname} ({_describe(obj)}) cannot be shared with numba: {e}.{hint}"
            ) from None
        except AttributeError as e:
            # PyTorch CPU tensors: the property exists on the class, so the
            # registry sends them here, but it raises for CPU data.
            raise TypeError(
                f"{argname} ({_describe(obj)}) is not a CUDA array ({e}). Pass NumPy "
                f"arrays to compute on the CPU (tensor.numpy()), or move every argument "
                f"to the GPU (tensor.cuda())."
            ) from None
        except (KeyError, TypeError, ValueError) as e:
            arr = self._bfloat16_via_bits(obj, root)
            if arr is not None:
                return arr
            raise TypeError(
                f"{argname} ({_describe(obj)}) does not describe itself through "
                f"__cuda_array_interface__: {type(e).__name__}: {e}") from None
        arr = _from_interface(obj, iface)
        if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 \
                and str(getattr(obj, "dtype", "")).endswith("bfloat16"):
            # The interface has no type code for bfloat16 ('<V2'); the object's
            # own dtype says what the bits are.
            arr = arr.view(_bfloat16_dtype())
        return arr

    def _bfloat16_via_bits(self, obj, root):
        """PyTorch bfloat16 tensors have no interface type code: share them as int16."""
        if root != "torch" or not str(getattr(obj, "dtype", "")).endswith("bfloat16"):
            return None
        torch = sys.modules["torch"]  # already imported: obj is one of its tensors
        bits = obj.view(torch.int16)
        return _from_interface(bits, bits.__cuda_array_interface__).view(_bfloat16_dtype())

    def check_out(self, out, argname):
        if out is None or not (_is_native(out) or hasattr(type(out), "__cuda_array_interface__")):
            raise TypeError(
                f"{argname} must be a CUDA array like the other arguments (a numba "
                f"device array or an object exposing __cuda_array_interface__), "
                f"got {_describe(out)}")
        if not _is_native(out):
            try:
                readonly = out.__cuda_array_interface__["data"][1]
            except Exception:  # prepare() below reports a clear error
                readonly = False
            if readonly:
                raise ValueError(f"{argname} is read-only")
        native = self.prepare(out, argname)
        if native is not out:
            # wrap() hands the caller back the very object they passed as out.
            native._numbasep_caller = out
        return native

    def wrap(self, result, like):
        """``result`` as the caller's kind of array.

        The caller's own ``out`` object when the result was written there; a
        CuPy array for CuPy input, a PyTorch tensor for PyTorch input (both
        views of the same device memory, through the CUDA array interface); a
        numba device array otherwise. CuPy and PyTorch are imported only when
        the input's type comes from them.
        """
        caller = getattr(result, "_numbasep_caller", None)
        if caller is not None:
            return caller
        root = _root_module(like)
        if root == "cupy":
            import cupy
            arr = cupy.asarray(result)
            if arr.dtype != result.dtype:   # bfloat16 travels as '<V2'
                arr = arr.view(result.dtype)
            return arr
        if root == "torch":
            import torch
            if result.dtype.name == "bfloat16":
                t = torch.as_tensor(result.view(np.int16), device=like.device)
                return t.view(torch.bfloat16)
            return torch.as_tensor(result, device=like.device)
        return result

    # -- helpers -------------------------------------------------------------------
    def _result(self, plan, shape, out, wide):
        if out is not None:
            return out
        dt = dtypes.accumulator(plan.dtype) if wide else plan.dtype
        return cuda.device_array(tuple(shape), dt)

    def _launch_depthwise(self, name, plan, inputs, shapes5, out, out_shape5):
        args = [_bits(_view(a, s)) for a, s in zip(inputs, shapes5)]
        o = _bits(_view(out, out_shape5))
        kern = kernels.depthwise(name, tuple(kernels.decoder_kind(a.dtype) for a in args),
                                 kernels.encoder_kind(o.dtype))
        kern[_grid1(o.size), _BLOCK](*args, o, *_params(plan))

    # -- depthwise ------------------------------------------------------------------
    def depthwise_forward(self, plan, x, w, out=None, wide=False):
        y = self._result(plan, plan.output_shape, out, wide)
        if y.size == 0 or _zero_if_empty_operand(y, x, w):
            return y
        name = "forward_cl" if plan.channels_last else "forward_cf"
        self._launch_depthwise(name, plan, (x, w), (plan.input_shape5, plan.filter_shape5),
                               y, plan.output_shape5)
        return y

    def depthwise_backprop_input(self, plan, dy, w, out=None, wide=False):
        dx = self._result(plan, plan.input_shape, out, wide)
        if dx.size == 0 or _zero_if_empty_operand(dx, dy, w):
            return dx
        name = "backprop_input_cl" if plan.channels_last else "backprop_input_cf"
        self._launch_depthwise(name, plan, (dy, w), (plan.output_shape5, plan.filter_shape5),
                               dx, plan.input_shape5)
        return dx

    def depthwise_backprop_filter(self, plan, x, dy, out=None, wide=False):
        dw = self._result(plan, plan.filter_shape, out, wide)
        taps = math.prod(plan.kernel)
        cm = plan.out_channels
        if dw.size == 0 or _zero_if_empty_operand(dw, x, dy):
            return dw
        xk = _bits(_view(x, plan.input_shape5))
        dyk = _bits(_view(dy, plan.output_shape5))
        kinds = (kernels.decoder_kind(xk.dtype), kernels.decoder_kind(dyk.dtype))
        acc = np.float64 if "f64" in kinds else np.float32
        L = taps * cm
        n, (od, oh, ow) = plan.batch, plan.out_sizes
        KH, KW = plan.kernel[1], plan.kernel[2]
        if plan.channels_last:
            # One thread per (filter element, partial); enough partials to fill
            # the device, each at least one (n, od, oh) row of the reduction.
            rows = n * od * oh
            P = max(1, min(rows, _cdiv(_TARGET_THREADS, L), _MAX_PARTS // L))
            parts = cuda.device_array((P, taps, cm), acc)
            grid = (max(1, min(_cdiv(L, _BLOCK), _MAX_BLOCKS)), min(P, _MAX_GRID_Y))
            kern = kernels.depthwise("backprop_filter_cl", kinds)
            kern[grid, _BLOCK](xk, dyk, parts, KH, KW, *_params(plan))
        else:
            # One block per (filter element, partial); each partial covers at
            # least a block's worth of (n, od, oh, ow) positions.
            q = n * od * oh * ow
            bs = kernels.FILTER_BLOCK
            P = max(1, min(_cdiv(q, bs), _cdiv(_TARGET_BLOCKS, L), _MAX_PARTS // L))
            parts = cuda.device_array((P, taps, cm), acc)
            grid = (max(1, min(L, _MAX_BLOCKS if SIMULATOR else 1 << 30)),
                    min(P, _MAX_GRID_Y))
            kern = kernels.depthwise("backprop_filter_cf", kinds)
            kern[grid, bs](xk, dyk, parts, KH, KW, *_params(plan))
        self._sum_parts(parts, dw, (taps, cm))
        return dw

    def _sum_parts(self, parts, out, shape2):
        """out (viewed as ``shape2``) = sum of ``parts`` over its first axis, in order."""
        target = out if _c_contiguous(out) else cuda.device_array(out.shape, out.dtype)
        t2 = _bits(_view(target, shape2))
        kern = kernels.sum_parts(kernels.decoder_kind(parts.dtype),
                                 kernels.encoder_kind(t2.dtype))
        kern[_grid1(t2.size), _BLOCK](parts, t2)
        if target is not out:
            _copy_into(out, target)

    # -- pointwise ----------------------------------------------------------------
    # CL: rows R = N * spatial; z2 (R, CM), pk2 (CM, F), out2 (R, F) -> 2-D GEMMs.
    # CF: z3 (N, CM, P), out3 (N, F, P) -> batched GEMMs sharing pk2.

    def _operand(self, a, shape):
        return _bits(_view(_contiguous(a), shape))

    def _batched(self, A, B, out, out_shape, ta, tb, a_b, b_b):
        """out[b] = op(A[b * a_b]) @ op(B[b * b_b]) for every b of out_shape[0]."""
        target = out if _c_contiguous(out) else cuda.device_array(out.shape, out.dtype)
        C = _bits(_view(target, out_shape))
        nb, I, J = out_shape
        kern = kernels.gemm(ta, tb, kernels.decoder_kind(A.dtype),
                            kernels.decoder_kind(B.dtype), kernels.encoder_kind(C.dtype))
        kern[self._gemm_grid(I, J, nb), (kernels.GEMM_TX, kernels.GEMM_TY)](
            A, B, C, nb, nb, 1, a_b, b_b)
        if target is not out:
            _copy_into(out, target)
        return out

    def _reduced(self, A, B, out, I, J, K, nbatch, ta, tb):
        """out (I, J) = sum over b of op(A[b]) @ op(B[b]), split over partial sums."""
        kinds = (kernels.decoder_kind(A.dtype), kernels.decoder_kind(B.dtype))
        acc = np.float64 if "f64" in kinds else np.float32
        tiles = _cdiv(I, kernels.GEMM_BM) * _cdiv(J, kernels.GEMM_BN)
        ktiles = max(1, _cdiv(K, kernels.GEMM_BK))
        want = max(1, _TARGET_BLOCKS // max(1, tiles))
        SB = max(1, min(nbatch, want))
        SK = max(1, min(want // SB, ktiles))
        cap = max(1, _MAX_PARTS // max(1, I * J))
        while SB * SK > cap and SK > 1:
            SK -= 1
        SB = max(1, min(SB, cap // SK))
        parts = cuda.device_array((SB * SK, I, J), acc)
        kern = kernels.gemm(ta, tb, *kinds, "num")
        kern[self._gemm_grid(I, J, SB * SK), (kernels.GEMM_TX, kernels.GEMM_TY)](
            A, B, parts, nbatch, SB, SK, 1, 1)
        self._sum_parts(parts, out, (I, J))
        return out

    def _gemm_grid(self, I, J, S):
        gx = _cdiv(J, kernels.GEMM_BN)
        gy = _cdiv(I, kernels.GEMM_BM)
        gz = S
        if SIMULATOR:
            return (max(1, min(gx, 2)), max(1, min(gy, 2)), max(1, min(gz, 2)))
        return (max(1, min(gx, 1 << 30)), max(1, min(gy, 65535)), max(1, min(gz, 65535)))

    def _pk2(self, plan, pk):
        return self._operand(pk, (1, plan.out_channels, plan.filters))

    def pointwise_forward(self, plan, z, pk, out=None, wide=False):
        o = self._result(plan, plan.separable_output_shape, out, wide)
        if o.size == 0:
            return o
        cm, f, n = plan.out_channels, plan.filters, plan.batch
        sp = math.prod(plan.out_sizes)
        pk2 = self._pk2(plan, pk)
        if plan.channels_last:
            z2 = self._operand(z, (1, n * sp, cm))
            return self._batched(z2, pk2, o, (1, n * sp, f), False, False, 1, 1)
        z3 = self._operand(z, (n, cm, sp))
        # out[n] (F, P) = pk2^T (F, CM) @ z[n] (CM, P): pk2 stored (CM, F) = [K, I].
        return self._batched(pk2, z3, o, (n, f, sp), True, False, 0, 1)

    def pointwise_backprop_input(self, plan, dout, pk, out=None, wide=False):
        o = self._result(plan, plan.output_shape, out, wide)
        if o.size == 0:
            return o
        cm, f, n = plan.out_channels, plan.filters, plan.batch
        sp = math.prod(plan.out_sizes)
        pk2 = self._pk2(plan, pk)
        if plan.channels_last:
            # dz (R, CM) = dout (R, F) @ pk2^T: pk2 stored (CM, F) = [J, K].
            d2 = self._operand(dout, (1, n * sp, f))
            return self._batched(d2, pk2, o, (1, n * sp, cm), False, True, 1, 1)
        d3 = self._operand(dout, (n, f, sp))
        # dz[n] (CM, P) = pk2 (CM, F) @ dout[n] (F, P).
        return self._batched(pk2, d3, o, (n, cm, sp), False, False, 0, 1)

    def pointwise_backprop_filter(self, plan, z, dout, out=None, wide=False):
        o = self._result(plan, plan.pointwise_shape, out, wide)
        if o.size == 0:
            return o
        cm, f, n = plan.out_channels, plan.filters, plan.batch
        sp = math.prod(plan.out_sizes)
        if plan.channels_last:
            # dpk (CM, F) = z2^T @ dout2: z2 stored (R, CM) = [K, I].
            z2 = self._operand(z, (1, n * sp, cm))
            d2 = self._operand(dout, (1, n * sp, f))
            return self._reduced(z2, d2, o, cm, f, n * sp, 1, True, False)
        # dpk = sum_n z[n] (CM, P) @ dout[n]^T: dout[n] stored (F, P) = [J, K].
        z3 = self._operand(z, (n, cm, sp))
        d3 = self._operand(dout, (n, f, sp))
        return self._reduced(z3, d3, o, cm, f, sp, n, False, True)

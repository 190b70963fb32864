"""Scratch buffers that one thread reuses from call to call.

16-bit operands are widened to float32 before the kernels run, and 16-bit
results are computed in float32 and rounded afterwards: per call, up to three
temporaries the size of the data. Fresh ones each call meant fresh pages, and the
page faults (and the kernel zeroing them) could cost more than the convolution:
2 threads, 8x56x56x144 forward, bfloat16 11 ms a call with 892 page faults each,
2.1 ms once the memory was reused. So each Python thread keeps one buffer per
*slot* (the operand's role in the primitive: first input, second input, result;
or a composition's intermediate) and hands out views of it.

A view is valid until its thread asks for the same slot again; the CPU driver
only gives scratch to temporaries that die before the primitive returns (widened
operands, results that are rounded into another array) or before the composition
returns (:meth:`CPUBackend.intermediate`), never to an array the caller gets. Buffers larger than :data:`KEEP_BYTES` are not kept.
"""

import threading

import numpy as np

from ... import aligned

#: Largest buffer (bytes) kept for reuse; a bigger temporary is allocated afresh.
KEEP_BYTES = 32 << 20

_local = threading.local()

OPERAND_0, OPERAND_1, RESULT = 0, 1, 2
# A composition's intermediates (the separable ops' depthwise output and its
# gradient): live across several primitives, so never a primitive's own slot.
INTERMEDIATE_0, INTERMEDIATE_1 = 3, 4
# Per-part sums that die within one primitive: the pointwise kernel gradient's
# (:mod:`.pointwise`) and the depthwise filter gradient's partial filters.
PARTIALS = 5
_SLOTS = 6
# Most views kept per thread (one per slot, shape and dtype asked for).
_VIEWS_MAX = 64


def empty(slot, shape, dtype):
    """An uninitialised C-contiguous array of ``shape`` (a tuple) and ``dtype`` from
    this thread's buffer for ``slot`` (grown when too small; 64-byte aligned).

    A repeated request gets the view it got before (the same object): slicing,
    viewing and reshaping the buffer took 1.0-1.2 us of a small call's 8-12 us on
    the Python side, the lookup 0.25 us (1 thread, NHWC 14x14 filter gradients
    with partial filters, N=1, alternating, best of 41 rounds: 32 channels 21.5
    -> 20.0 us a call, 384 channels 50.9 -> 49.1). Callers make their own views
    to reshape or mark read-only, never changing this one's shape or flags."""
    views = getattr(_local, "views", None)
    if views is not None:
        v = views.get((slot, shape, dtype))
        if v is not None:
            return v
    dt = np.dtype(dtype)
    n = 1
    for s in shape:
        n *= s
    nbytes = n * dt.itemsize
    if nbytes > KEEP_BYTES:
        return aligned.empty(shape, dt)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = [None] * _SLOTS
        views = _local.views = {}
    buf = bufs[slot]
    if buf is None or buf.nbytes < nbytes:
        buf = bufs[slot] = aligned.empty_aligned(max(nbytes, 64), np.uint8)
        # views of the old buffer would keep it alive (and be valid no longer)
        for k in [k for k in views if k[0] == slot]:
            del views[k]
    if len(views) >= _VIEWS_MAX:
        views.clear()
    v = views[slot, shape, dtype] = buf[:nbytes].view(dt).reshape(shape)
    return v


def release():
    """Drop this thread's buffers (they are kept until the thread ends otherwise)."""
    _local.bufs = None
    _local.views = None

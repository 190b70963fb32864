"""The pointwise (1x1) steps of the separable convolutions as small products of
matrices, on :func:`.simd.pointwise_rows`: channels-last, vectorised along each
pixel's channels; channels-first (``planar_*``), along each image's pixels.

Where one operand is small (the pointwise kernel), these take the place of
NumPy's BLAS, whose threads kept spinning for a while after each product and
took the cores from the depthwise kernels that followed (8x56x56x144 -> 24
filters, separable gradient, 2 threads: each depthwise kernel after a GEMM took
3.4-3.8 ms instead of 0.65-0.7).
"""

import numpy as np
from numba import njit, prange

from .simd import pointwise_rows as _pointwise_rows, prefetch as _prefetch

# Parts the rows of a product run in (and that the kernel gradient sums
# separately): a split that depends on the problem only, so that the sums do not
# depend on the thread count.
PARTS = 64


@njit(inline="always")
def _rows(part, parts, P):
    """[k0, k1): the rows of part ``part`` of ``parts``."""
    return part * P // parts, (part + 1) * P // parts


@njit(inline="always")
def _part_products(part, parts, a, b, dst, vecs):
    """Rows ``k0:k1`` of part ``part`` of :func:`products`."""
    P, K = a.shape
    J = dst.shape[1]
    k0, k1 = _rows(part, parts, P)
    _pointwise_rows(dst.reshape(dst.size), k0 * J, J, a.reshape(a.size), k0 * K, K, 1,
                    b.reshape(b.size), 0, b.shape[1], J, K, k1 - k0, vecs, 0)


@njit(inline="always")
def _part_transposed(part, parts, a, b, partials, vecs):
    """Part ``part``'s sums of :func:`transposed_products`."""
    P, F = a.shape
    C = b.shape[1]
    k0, k1 = _rows(part, parts, P)
    _pointwise_rows(partials.reshape(partials.size), part * F * C, C, a.reshape(a.size),
                    k0 * F, 1, F, b.reshape(b.size), k0 * C, C, C, k1 - k0, F, vecs, 0)


@njit(parallel=True, nogil=True, cache=True)
def products(a, b, dst, vecs):
    """``dst[k, j] = sum over i of a[k, i] * b[i, j]`` for ``a[P, K]``,
    ``b[K, JP]`` (rows padded to JP >= J columns, which stay aligned) and
    ``dst[P, J]``, K >= 1: the products in order of i (:func:`.simd.pointwise_rows`,
    ``vecs`` vectors of columns at a time), the rows in up to :data:`PARTS`
    parts."""
    parts = min(a.shape[0], PARTS)
    for part in prange(parts):
        _part_products(part, parts, a, b, dst, vecs)


# Pixels of one image a task of :func:`planar_products` takes: enough tasks for
# the threads on one 56x56 image, each a few column blocks of its rows.
PLANAR_PIXELS = 256


@njit(parallel=True, nogil=True, cache=True)
def planar_products(m, mstep, mloop, a, dst, vecs):
    """The channels-first twin of :func:`products`: ``dst[n, k, p] = sum over i
    of M[k, i] * a[n, i, p]`` for ``a[N, K, P]`` and ``dst[N, R, P]``, the small
    matrix ``M[k, i] = m[k*mstep + i*mloop]`` read where it lies (the pointwise
    kernel or its transpose, no copy), K >= 1: the products in order of i
    (:func:`.simd.pointwise_rows`, ``vecs`` vectors of pixels at a time), in
    tasks of :data:`PLANAR_PIXELS` pixels of one image."""
    N, K, P = a.shape
    R = dst.shape[1]
    chunks = (P + PLANAR_PIXELS - 1) // PLANAR_PIXELS
    af = a.reshape(a.size)
    df = dst.reshape(dst.size)
    for task in prange(N * chunks):
        n, c = task // chunks, task % chunks
        p0 = c * PLANAR_PIXELS
        _pointwise_rows(df, n * R * P + p0, P, m, 0, mstep, mloop, af, n * K * P + p0, P,
                        min(PLANAR_PIXELS, P - p0), K, R, vecs, 0)


@njit(parallel=True, nogil=True, cache=True)
def planar_kernel_gradient(a, b, partials, vecs):
    """The channels-first kernel gradient: ``partials[q, i, j] = sum over the
    pixels p of part q of a[n, i, p] * b[n, j, p]`` for ``a[N, C, P]``,
    ``b[N, F, P]`` and ``partials[parts, C, F]``; the caller sums the parts in
    order. A part takes consecutive pieces of :data:`PLANAR_PIXELS` pixels of one
    image (in order of image, then pixel), each piece's ``b`` transposed into a
    buffer of its own so that :func:`.simd.pointwise_rows` (``vecs`` vectors of F
    at a time) sums its products in order of p, then added to the part's sums."""
    N, C, P = a.shape
    F = b.shape[1]
    parts = partials.shape[0]
    chunks = (P + PLANAR_PIXELS - 1) // PLANAR_PIXELS
    units = N * chunks
    af = a.reshape(a.size)
    for q in prange(parts):
        t = np.empty(PLANAR_PIXELS * F, a.dtype)
        piece = np.empty(C * F, a.dtype)
        sums = partials[q].reshape(C * F)
        sums[:] = 0
        for u in range(q * units // parts, (q + 1) * units // parts):
            n, c = u // chunks, u % chunks
            p0 = c * PLANAR_PIXELS
            k = min(PLANAR_PIXELS, P - p0)
            for j in range(F):
                for p in range(k):
                    t[p * F + j] = b[n, j, p0 + p]
            _pointwise_rows(piece, 0, F, af, n * C * P + p0, P, 1, t, 0, F, F, k, C, vecs, 0)
            sums += piece


@njit(parallel=True, nogil=True, cache=True)
def transposed_products(a, b, partials, vecs):
    """``partials[p, f, c] = sum over the rows k of part p of a[k, f] * b[k, c]``
    for ``a[P, F]``, ``b[P, C]`` and ``partials[parts, F, C]`` (parts <= P): each
    part's products in order of k (:func:`.simd.pointwise_rows`, ``vecs``
    vectors of C at a time); the caller sums the parts in order.

    Each part's rows of ``a`` and ``b`` are prefetched before its sums: the
    sums read ``a`` a few elements per row and pass at a time, a pattern the
    hardware prefetchers do not follow from memory (2 threads, 8 chunks of
    147x147 pixels, 128 x 64: 20 -> 15 ms)."""
    P, F = a.shape
    C = b.shape[1]
    parts = partials.shape[0]
    af = a.reshape(a.size)
    bf = b.reshape(b.size)
    line = 64 // a.itemsize
    for part in prange(parts):
        k0, k1 = _rows(part, parts, P)
        for i in range(k0 * F, k1 * F, line):
            _prefetch(af, i)
        for i in range(k0 * C, k1 * C, line):
            _prefetch(bf, i)
        _part_transposed(part, parts, a, b, partials, vecs)


@njit(parallel=True, nogil=True, cache=True)
def gradients(dout, bt, z, dz, partials, vecs):
    """Both pointwise gradients of a separable convolution in one pass over the
    pixels: ``dz = dout @ bt`` (:func:`products`, ``bt`` the kernel transposed
    and padded) and the kernel gradient's per-part sums (``partials``, as
    :func:`transposed_products` of ``dout`` and ``z``), in the same parts. The
    products read each part's rows of ``dout`` in order, into the cache the
    kernel gradient's sums then read them from (2 threads, 8 chunks of 147x147
    pixels, 128 x 64 channels: 24.4 ms, against 15 + 12 ms apart)."""
    parts = partials.shape[0]
    for part in prange(parts):
        _part_products(part, parts, dout, bt, dz, vecs)
        _part_transposed(part, parts, dout, z, partials, vecs)

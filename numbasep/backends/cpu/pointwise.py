"""The pointwise (1x1) steps of the channels-last separable convolutions as small
products of matrices, on :func:`.simd.pointwise_rows`.

Where one operand is small (the pointwise kernel), these take the place of
NumPy's BLAS, whose threads kept spinning for a while after each product and
took the cores from the depthwise kernels that followed (8x56x56x144 -> 24
filters, separable gradient, 2 threads: each depthwise kernel after a GEMM took
3.4-3.8 ms instead of 0.65-0.7).
"""

from numba import njit, prange

from .simd import pointwise_rows as _pointwise_rows

# Parts the rows of a product run in (and that the kernel gradient sums
# separately): a split that depends on the problem only, so that the sums do not
# depend on the thread count.
PARTS = 64


@njit(inline="always")
def _rows(part, parts, P):
    """[k0, k1): the rows of part ``part`` of ``parts``."""
    return part * P // parts, (part + 1) * P // parts


@njit(parallel=True, nogil=True, cache=True)
def products(a, b, dst, vecs):
    """``dst[k, j] = sum over i of a[k, i] * b[i, j]`` for ``a[P, K]``,
    ``b[K, JP]`` (rows padded to JP >= J columns, which stay aligned) and
    ``dst[P, J]``, K >= 1: the products in order of i (:func:`.simd.pointwise_rows`,
    ``vecs`` vectors of columns at a time), the rows in up to :data:`PARTS`
    parts."""
    P, K = a.shape
    J = dst.shape[1]
    parts = min(P, PARTS)
    for part in prange(parts):
        k0, k1 = _rows(part, parts, P)
        _pointwise_rows(dst.reshape(dst.size), k0 * J, J, a.reshape(a.size), k0 * K, K, 1,
                        b.reshape(b.size), 0, b.shape[1], J, K, k1 - k0, vecs)


@njit(parallel=True, nogil=True, cache=True)
def transposed_products(a, b, partials, vecs):
    """``partials[p, f, c] = sum over the rows k of part p of a[k, f] * b[k, c]``
    for ``a[P, F]``, ``b[P, C]`` and ``partials[parts, F, C]`` (parts <= P): each
    part's products in order of k (:func:`.simd.pointwise_rows`, ``vecs``
    vectors of C at a time); the caller sums the parts in order."""
    P, F = a.shape
    C = b.shape[1]
    parts = partials.shape[0]
    for part in prange(parts):
        k0, k1 = _rows(part, parts, P)
        _pointwise_rows(partials.reshape(partials.size), part * F * C, C, a.reshape(a.size),
                        k0 * F, 1, F, b.reshape(b.size), k0 * C, C, C, k1 - k0, F, vecs)

"""Channel groups of a depth multiplier, channels-last: repeat each channel, sum each group.

A depthwise problem with depth multiplier M is the multiplier-1 problem on the
input with each channel repeated M times (output channel c*M + m sees input
channel c); its input gradient is that problem's, each group of M channels
summed. Channels-last, the groups are runs of M adjacent elements, which NumPy's
broadcasting copies and strided sums walk a few elements at a time; these loops
take a pixel's channels at once.
"""

from numba import njit, prange


@njit(parallel=True, nogil=True, cache=True)
def repeat(src, dst):
    """dst[r, c*M + m] = src[r, c] for src (R, C), dst (R, C*M), C > 0."""
    R, C = src.shape
    M = dst.shape[1] // C
    for r in prange(R):
        for c in range(C):
            v = src[r, c]
            for m in range(M):
                dst[r, c * M + m] = v


@njit(parallel=True, nogil=True, cache=True)
def sum_groups(src, dst):
    """dst[r, c] = src[r, c*M] + src[r, c*M + 1] + ... (in order of m) for src
    (R, C*M), dst (R, C), C > 0."""
    R, C = dst.shape
    M = src.shape[1] // C
    for r in prange(R):
        for c in range(C):
            s = src[r, c * M]
            for m in range(1, M):
                s += src[r, c * M + m]
            dst[r, c] = s

"""Helpers shared by the asv suites: which cases run, and how an asv parameter becomes one.

The cases come from :mod:`numbasep.suite` (the one definition of the suite).
By default a small subset runs, so that ``asv run --python=same --quick``
finishes in a few minutes on 2 cores; ``NUMBASEP_ASV_FULL=1`` runs every shape
of PERFORMANCE.md at N = 1, 8 and 32.

A parameter combination the suite has no row for (for example a bfloat16 NCHW
row) is still built with :func:`numbasep.suite.make_case`; one that numbasep
cannot run raises ``NotImplementedError`` in ``setup``, which asv records as
skipped.
"""

import os

from numbasep import suite

FULL = os.environ.get("NUMBASEP_ASV_FULL", "") not in ("", "0")

#: "HxWxC/kKsS/NN" -> (H, C, k, s, N); the default subset.
_DEFAULT_2D = (
    "56x56x144/k3s1/N8",
    "28x28x240/k5s1/N8",
    "7x7x960/k3s1/N32",
)


def shape_key(hw, c, k, s, n):
    return f"{hw}x{hw}x{c}/k{k}s{s}/N{n}"


def _all_2d():
    return tuple(shape_key(hw, c, k, s, n)
                 for _, hw, c, k, s in suite.SHAPES_2D for n in suite.BATCHES)


SHAPES_2D = _all_2d() if FULL else _DEFAULT_2D


def parse_key(key):
    """``"56x56x144/k3s1/N8"`` -> ``(spatial, C, k, s, N)``."""
    dims, ks, n = key.split("/")
    sizes = tuple(int(v) for v in dims.split("x"))
    k, s = ks[1:].split("s")
    return sizes[:-1], sizes[-1], int(k), int(s), int(n[1:])


def build(op, key, dtype="float32", layout=None, filters=None):
    """(arrays, fn) for the case ``key`` run as ``op``; the first call compiles."""
    spatial, c, k, s, n = parse_key(key)
    case = suite.make_case(op, n, spatial, c, k, s, filters=filters, dtype=dtype,
                           layout=layout)
    try:
        arrays, fn = suite.make_inputs(case, 0)
        fn()
    except (TypeError, ValueError) as e:
        raise NotImplementedError(f"{case.name}: {e}") from None
    return case, arrays, fn

"""Helpers shared by several test modules (imported as ``support``, like ``reference``)."""

import numbasep


def cuda_missing():
    """None when the CUDA backend loads (a GPU or numba's simulator), else why not."""
    try:
        numbasep.backends.get("cuda")
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        return f"CUDA backend not available: {type(e).__name__}: {e}"
    return None


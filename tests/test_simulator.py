"""The CUDA simulator's shared arrays are one per (block, calling line) even when
the simulated threads race to allocate them (``tests/simulator.py``)."""

import os
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                                reason="only the CUDA simulator is patched")


class SlowSize:
    """A size whose conversion takes a while: it holds a thread inside the
    allocation, between looking up the calling line and recording its array."""

    def __index__(self):
        time.sleep(0.05)
        return 4


def test_threads_of_a_block_get_the_same_shared_array():
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    shared = FakeCUDAShared(0)
    got = []
    start = threading.Barrier(4)

    def thread():
        start.wait()
        got.append(shared.array((SlowSize(),), np.float32))

    ts = [threading.Thread(target=thread) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(got) == 4 and all(a is got[0] for a in got)
    assert got[0].shape == (4,) and got[0].dtype == np.float32

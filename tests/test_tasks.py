"""The parallel launcher that runs the CPU kernels' tasks by address
(numbasep/backends/cpu/tasks.py): every task runs once with its index, the
arrays' types select the compiled task, and a launch with argument types the
task was not compiled for is a typing error, never a call with the wrong
layout."""

import numba
import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from numbasep.backends.cpu import tasks


@njit(nogil=True, cache=True)
def _fill_row(i, count, out, src, scale):
    for j in range(out.shape[1]):
        out[i, j] = src[i, j] * scale + i * count


@njit(nogil=True, cache=True)
def _fill_row_twice(i, count, out, src, scale):
    for j in range(out.shape[1]):
        out[i, j] = 2 * (src[i, j] * scale + i * count)


def _rows(out, *_):
    return out.shape[0]


@njit(nogil=True, cache=True)
def _mark(i, count, out):
    out[i] = count


def test_each_task_runs_once_with_its_index_and_the_count():
    fill = tasks.Parallel(_fill_row, _rows, 2)
    src = np.arange(35, dtype=np.float64).reshape(7, 5)
    out = np.full_like(src, np.nan)
    fill(out, src, 3)
    expected = src * 3 + np.arange(7)[:, None] * 7
    np.testing.assert_array_equal(out, expected)


def test_the_arrays_types_select_the_compiled_task():
    fill = tasks.Parallel(_fill_row, _rows, 2)
    src = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = np.zeros_like(src)
    fill(out, src, 2)
    readonly = src.copy()
    readonly.flags.writeable = False
    out64 = np.zeros(src.shape, np.float64)
    fill(out64, readonly, 2)
    assert len(fill._compiled) == 2
    np.testing.assert_array_equal(out64, out.astype(np.float64))
    (sig_a, _), (sig_b, _) = [(k, v) for k, v in fill._compiled.items()]
    assert sig_a != sig_b


def test_tasks_of_one_signature_share_a_launcher():
    once = tasks.Parallel(_fill_row, _rows, 2)
    twice = tasks.Parallel(_fill_row_twice, _rows, 2)
    src = np.ones((3, 2))
    a, b = np.zeros_like(src), np.zeros_like(src)
    once(a, src, 1)
    twice(b, src, 1)
    np.testing.assert_array_equal(b, 2 * a)
    (launch_a, addr_a), = once._compiled.values()
    (launch_b, addr_b), = twice._compiled.values()
    assert launch_a is launch_b and addr_a != addr_b


def test_other_argument_types_are_a_typing_error_not_a_call():
    """The lookup keys on the arrays only; a scalar of another type reaches the
    launcher, whose check of the task's signature refuses it."""
    fill = tasks.Parallel(_fill_row, _rows, 2)
    src = np.ones((3, 2))
    out = np.zeros_like(src)
    fill(out, src, 1)
    before = out.copy()
    with pytest.raises(TypingError, match="do not match its signature"):
        fill(out, src, 1.5)
    np.testing.assert_array_equal(out, before)    # untouched by the refused launch


def test_no_tasks_no_calls():
    fill = tasks.Parallel(_fill_row, _rows, 2)
    out = np.zeros((0, 4))
    fill(out, out, 1)
    assert out.shape == (0, 4)


def test_tasks_compile_with_numba_noalias_flag():
    """The tasks are compiled with Numba's noalias flag, set through a private
    hook of the dispatcher: this fails if a Numba release moves it."""
    fill = tasks.Parallel(_fill_row, _rows, 2)
    src = np.ones((3, 4))
    fill(np.zeros_like(src), src, 2)
    assert all(c.fndesc.noalias for c in _fill_row.overloads.values())


def test_per_thread_launches_run_at_most_one_task_per_thread():
    """``count_of`` gives the most tasks; the launch runs min(that, threads),
    with the thread count read when the launch runs (after set_num_threads)."""
    spread = tasks.Parallel(_mark, _rows, 1, per_thread=True)
    old = numba.get_num_threads()
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            for most in (1, threads, threads + 3):
                out = np.zeros(most, np.int64)
                spread(out)
                count = min(most, threads)
                np.testing.assert_array_equal(out, [count] * count + [0] * (most - count))
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("P, C", [(1, 5), (2, 3), (5, 960), (7, 1000), (3, 2300)])
def test_partial_filters_are_summed_in_order_whatever_the_thread_count(P, C):
    """``kernels.sum_partials`` splits the filter's elements among one task per
    thread, in blocks; each element is still parts[0] + parts[1] + ... in that
    order, in float32: bit for bit the sum numpy forms one partial at a time.
    (3x3 taps x C channels: 9*2300 elements span several blocks per task.)"""
    from numbasep.backends.cpu import kernels
    rng = np.random.default_rng(P * C)
    # magnitudes far apart, so that another order of the adds rounds differently
    parts = (rng.standard_normal((P, 1, 3, 3, C, 1))
             * 10.0 ** rng.integers(-6, 6, (P, 1, 3, 3, C, 1))).astype(np.float32)
    want = parts[0].copy()
    for p in range(1, P):
        want += parts[p]
    old = numba.get_num_threads()
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            dw = np.full((1, 3, 3, C, 1), np.nan, np.float32)
            kernels.sum_partials(parts, dw)
            assert dw.tobytes() == want.tobytes(), threads
    finally:
        numba.set_num_threads(old)

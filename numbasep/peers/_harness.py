"""Timing and case plumbing shared by numbasep's own timings and every peer runner.

This module is imported both as ``numbasep.peers._harness`` (by the driver and
by :mod:`numbasep.bench`) and as a plain ``_harness`` module by the runner
scripts, which run in another interpreter (possibly a virtual environment
without numbasep) and find it next to themselves on ``sys.path``. It therefore
uses the standard library only (NumPy is imported lazily by the helpers that
build arrays).

Protocol of a runner: it reads one JSON object on stdin::

    {"peer": "torch-cl", "threads": 2, "repeats": 15, "min_time": 0.002,
     "max_case_time": 5.0, "cases": [<Case.to_dict()>, ...]}

and writes JSON lines on stdout: first ``{"event": "start", "peer": ..., "version": ...}``
or ``{"event": "missing", "peer": ..., "error": ...}`` (the framework cannot be
imported), then one ``{"event": "case", "name": ..., ...timing...}`` or
``{"event": "case", "name": ..., "error": ...}`` per case, and finally
``{"event": "done"}``.
"""

import gc
import json
import math
import os
import statistics
import sys
import time

#: Environment variables that cap the thread pools of the usual runtimes.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "TF_NUM_INTRAOP_THREADS", "NUMBA_NUM_THREADS")


def limit_threads_env(threads, env=None):
    """Environment for a child process restricted to ``threads`` threads."""
    env = dict(os.environ if env is None else env)
    for k in THREAD_ENV:
        if k != "NUMBA_NUM_THREADS":
            env[k] = str(threads)
    env["TF_NUM_INTEROP_THREADS"] = "1"
    return env


def pin_cpus(threads):
    """Restrict this process to ``threads`` CPUs (when the OS allows and more exist).

    Returns the CPUs kept, or ``None`` when affinity is not supported.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if threads < len(cpus):
        cpus = cpus[:threads]
        os.sched_setaffinity(0, cpus)
    return cpus


def summarize(times):
    """Median, quartiles, min and max of per-call times (seconds)."""
    times = sorted(times)
    if len(times) >= 2:
        q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    else:
        q1 = q3 = times[0]
    return {"median_s": statistics.median(times), "q1_s": q1, "q3_s": q3,
            "min_s": times[0], "max_s": times[-1]}


def time_call(fn, repeats=15, min_time=2e-3, max_case_time=5.0, warmup=2, sync=None):
    """Time ``fn()``: warm up, then ``repeats`` samples of ``number`` back-to-back calls.

    Parameters
    ----------
    fn : callable
        Runs the operation once.
    repeats : int
        Samples taken (fewer, but at least 3, when a sample would make the case
        exceed ``max_case_time``).
    min_time : float
        Each sample lasts at least this long: fast calls are repeated ``number``
        times per sample, and the sample is the mean over those calls.
    max_case_time : float
        Seconds the timed samples of one case may take in all (roughly).
    warmup : int
        Untimed calls first (the first compiles or builds plans).
    sync : callable, optional
        Called after ``fn`` inside the timed region (for asynchronous runtimes:
        JAX's ``block_until_ready`` is applied by the runner itself).

    Returns
    -------
    dict
        ``median_s``, ``q1_s``, ``q3_s`` (the spread reported is the interquartile
        range ``q3 - q1``), ``min_s``, ``max_s``, ``first_call_s`` (the first,
        compiling call), ``number`` and ``repeats``.
    """
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    for _ in range(max(0, warmup - 1)):
        fn()
    t = time.perf_counter()
    fn()
    single = max(time.perf_counter() - t, 1e-7)
    number = max(1, min(10000, math.ceil(min_time / single)))
    sample = single * number
    repeats = max(3, min(repeats, int(max_case_time / sample)))
    times = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - t) / number)
    finally:
        if was_enabled:
            gc.enable()
    res = summarize(times)
    res.update(first_call_s=first, number=number, repeats=repeats)
    return res


# ------------------------------------------------------------------ runner side

def emit(obj):
    """Write one JSON line to stdout and flush it (the driver reads line by line)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def random_array(rng, shape, dtype="float32"):
    """Standard-normal float32 NumPy array of ``shape`` (callers cast as they need),
    64-byte aligned as numbasep's own inputs are (``numbasep.aligned``, which
    this standalone module cannot import): a peer that wraps it without a copy
    gets the alignment its own allocator would give."""
    import numpy as np
    shape = tuple(shape)
    n = math.prod(shape)
    buf = np.empty(4 * n + 64, np.uint8)
    start = -buf.__array_interface__["data"][0] % 64
    a = buf[start:start + 4 * n].view(np.float32).reshape(shape)
    a[...] = rng.standard_normal(shape, dtype=np.float32)
    return a


def main(peer_name, load, build):
    """Body of a runner script.

    Parameters
    ----------
    peer_name : str
        Default peer name (the request's ``peer`` field wins).
    load : callable
        ``load(threads) -> (version_string, module)``; raises ``ImportError`` when the
        framework is not installed. It must set the framework's thread pools.
    build : callable
        ``build(module, case_dict, rng) -> fn`` returning a zero-argument callable
        that runs the case once (synchronously), or raising ``NotImplementedError``
        with a reason when the peer has no such operator.
    """
    req = json.loads(sys.stdin.read())
    peer = req.get("peer", peer_name)
    threads = int(req.get("threads", 2))
    pin_cpus(threads)
    try:
        version, mod = load(threads)
    except Exception as e:  # ImportError, or a broken installation
        emit({"event": "missing", "peer": peer, "error": f"{type(e).__name__}: {e}",
              "python": sys.executable})
        return 3
    emit({"event": "start", "peer": peer, "version": version, "python": sys.executable,
          "threads": threads})
    import numpy as np
    for case in req["cases"]:
        rng = np.random.default_rng(0)
        try:
            fn = build(mod, case, rng)
            res = time_call(fn, repeats=int(req.get("repeats", 15)),
                            min_time=float(req.get("min_time", 2e-3)),
                            max_case_time=float(req.get("max_case_time", 5.0)))
            res.update(event="case", name=case["name"])
            emit(res)
        except NotImplementedError as e:
            emit({"event": "case", "name": case["name"], "unsupported": str(e)})
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            emit({"event": "case", "name": case["name"], "error": msg[:500]})
        fn = None
        gc.collect()
    emit({"event": "done", "peer": peer})
    return 0

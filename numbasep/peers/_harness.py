"""Timing and case plumbing shared by numbasep's own timings and every peer runner.

This module is imported both as ``numbasep.peers._harness`` (by the driver and
by :mod:`numbasep.bench`) and as a plain ``_harness`` module by the runner
scripts, which run in another interpreter (possibly a virtual environment
without numbasep) and find it next to themselves on ``sys.path``. It therefore
uses the standard library only (NumPy is imported lazily by the helpers that
build arrays).

Protocol of a runner, one JSON object per line each way. The runner reads a
header::

    {"peer": "torch", "threads": 2}

and answers ``{"event": "start", "peer": ..., "version": ...}``, or
``{"event": "missing", "peer": ..., "error": ...}`` when the framework cannot be
imported (and exits). Then it serves commands until ``{"cmd": "quit"}`` or the
end of its input, when it answers ``{"event": "done"}``:

``{"cmd": "case", "case": <Case.to_dict()>, "min_time": 0.002, "warmup": 2}``
    Build the case, call it (the first call, timed), warm it up and calibrate
    ``number``, the back-to-back calls of one sample (:func:`calibrate`);
    answer ``{"event": "ready", "name": ..., "first_call_s": ..., "single_s": ...,
    "number": ...}``, or ``{"event": "case", "name": ..., "unsupported": ...}``
    (the peer has no such operator) or ``... "error": ...}``.
``{"cmd": "samples", "count": k, "warm_s": 0.02}``
    Untimed calls for ``warm_s`` seconds (after another process ran, the first
    calls are slower), then ``k`` samples of the ready case (:func:`samples`);
    answer ``{"event": "samples", "times": [...]}``, seconds per call.
``{"cmd": "end"}``
    Drop the case and its arrays; answer ``{"event": "ended"}``.

The driver interleaves these commands across the runners and numbasep itself,
so that every contender's samples of a case are spread over the same stretch of
time (:func:`numbasep.peers.driver.interleave`).
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


def calibrate(fn, min_time=2e-3, warmup=2):
    """Call ``fn`` ``warmup`` times (the first timed: it compiles or builds plans),
    then once more, timed, to choose ``number``, the back-to-back calls of one
    sample (a sample lasts at least ``min_time``).

    Returns
    -------
    dict
        ``first_call_s``, ``single_s`` (the timed call after warm-up) and ``number``.
    """
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    for _ in range(max(0, warmup - 1)):
        fn()
    t = time.perf_counter()
    fn()
    single = max(time.perf_counter() - t, 1e-7)
    return {"first_call_s": first, "single_s": single,
            "number": max(1, min(10000, math.ceil(min_time / single)))}


def samples(fn, number, count, warm_s=0.0):
    """``count`` samples of ``number`` back-to-back calls of ``fn``, with the
    garbage collector off; the seconds per call of each sample. Untimed calls
    first for ``warm_s`` seconds (none when 0)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        fn()
    times = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(count):
            t = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - t) / number)
    finally:
        if was_enabled:
            gc.enable()
    return times


def repeats_within(repeats, sample_s, max_case_time):
    """Samples to take: ``repeats``, fewer (at least 3) when samples of
    ``sample_s`` seconds would exceed ``max_case_time`` in all."""
    return max(3, min(repeats, int(max_case_time / sample_s)))


def time_call(fn, repeats=15, min_time=2e-3, max_case_time=5.0, warmup=2):
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

    Returns
    -------
    dict
        ``median_s``, ``q1_s``, ``q3_s`` (the spread reported is the interquartile
        range ``q3 - q1``), ``min_s``, ``max_s``, ``first_call_s`` (the first,
        compiling call), ``number`` and ``repeats``.
    """
    cal = calibrate(fn, min_time, warmup)
    number = cal["number"]
    repeats = repeats_within(repeats, cal["single_s"] * number, max_case_time)
    res = summarize(samples(fn, number, repeats))
    res.update(first_call_s=cal["first_call_s"], number=number, repeats=repeats)
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


def _read_commands():
    for line in sys.stdin:
        line = line.strip()
        if line:
            yield json.loads(line)


def main(peer_name, load, build):
    """Body of a runner script: serve the protocol above on stdin and stdout.

    Parameters
    ----------
    peer_name : str
        Default peer name (the header's ``peer`` field wins).
    load : callable
        ``load(threads) -> (version_string, module)``; raises ``ImportError`` when the
        framework is not installed. It must set the framework's thread pools.
    build : callable
        ``build(module, case_dict, rng) -> fn`` returning a zero-argument callable
        that runs the case once (synchronously), or raising ``NotImplementedError``
        with a reason when the peer has no such operator.
    """
    commands = _read_commands()
    req = next(commands, {})
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
    fn = cal = None
    for cmd in commands:
        what = cmd.get("cmd")
        if what == "quit":
            break
        if what == "case":
            case = cmd["case"]
            fn = cal = None
            try:
                fn = build(mod, case, np.random.default_rng(0))
                cal = calibrate(fn, float(cmd.get("min_time", 2e-3)), int(cmd.get("warmup", 2)))
                emit(dict(cal, event="ready", name=case["name"]))
            except NotImplementedError as e:
                fn = None
                emit({"event": "case", "name": case["name"], "unsupported": str(e)})
            except Exception as e:
                fn = None
                emit({"event": "case", "name": case["name"],
                      "error": f"{type(e).__name__}: {e}"[:500]})
        elif what == "samples" and fn is not None:
            emit({"event": "samples", "times": samples(fn, cal["number"], int(cmd["count"]),
                                                       float(cmd.get("warm_s", 0.0)))})
        elif what == "end":
            fn = cal = None
            gc.collect()
            emit({"event": "ended"})
        else:
            emit({"event": "error", "error": f"unexpected command {cmd!r}"[:500]})
    emit({"event": "done", "peer": peer})
    return 0

"""Run the peers, each in its own process, on the cases numbasep ran.

Why separate processes: TensorFlow's and PyTorch's thread pools keep spinning
after a call and steal the cores from Numba's threads (40 ms stalls were seen
with TensorFlow and numba in one process), and the peers need not be installed
in numbasep's environment at all: ``python`` may be another virtual
environment's interpreter.

Each peer gets the same case list (as :meth:`numbasep.suite.Case.to_dict`), the
same thread count (thread-pool settings, ``OMP_NUM_THREADS`` and friends, and a
CPU affinity of that many CPUs) and the same timing protocol
(:func:`numbasep.peers._harness.time_call`).

Examples
--------
>>> from numbasep.peers import driver
>>> sorted(driver.PEERS)
['jax', 'tf-eigen', 'tf-onednn', 'torch']
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from ._harness import limit_threads_env

HERE = os.path.dirname(os.path.abspath(__file__))

#: peer name -> (runner script, extra environment, what it is)
PEERS = {
    "tf-onednn": ("tf_runner.py", {"TF_ENABLE_ONEDNN_OPTS": "1"},
                  "TensorFlow tf.raw_ops.DepthwiseConv2dNative*, oneDNN kernels (TF default)"),
    "tf-eigen": ("tf_runner.py", {"TF_ENABLE_ONEDNN_OPTS": "0"},
                 "TensorFlow tf.raw_ops.DepthwiseConv2dNative*, Eigen kernels"),
    "torch": ("torch_runner.py", {},
              "PyTorch conv(groups=C), channels_last memory for channels-last cases"),
    "jax": ("jax_runner.py", {}, "JAX lax.conv_general_dilated(feature_group_count=C), jit"),
}


def runner_path(peer):
    """Path of the script that runs ``peer``."""
    return os.path.join(HERE, PEERS[peer][0])


def run_peer(peer, cases, python=None, threads=2, repeats=15, min_time=2e-3,
             max_case_time=5.0, timeout=900.0, on_case=None):
    """Run one peer in a child process.

    Parameters
    ----------
    peer : str
        A key of :data:`PEERS`.
    cases : sequence of numbasep.suite.Case or dict
    python : str, optional
        Interpreter for the child (default: the current one).
    threads : int
        Threads the peer may use.
    repeats, min_time, max_case_time
        Timing protocol, as :func:`numbasep.peers._harness.time_call`.
    timeout : float
        Seconds after which the child is killed (results so far are kept).
    on_case : callable, optional
        ``on_case(name)`` after each case (progress).

    Returns
    -------
    info : dict
        ``status`` (``"ran"``, ``"missing"``: the framework is not importable by
        that interpreter, or ``"failed"``), and ``version``, ``threads``,
        ``python``, ``error`` as known.
    results : dict
        Case name -> timing dict (or a dict with ``error`` / ``unsupported``).
    """
    python = python or sys.executable
    script, extra, what = PEERS[peer]
    env = limit_threads_env(threads)
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    request = {"peer": peer, "threads": threads, "repeats": repeats, "min_time": min_time,
               "max_case_time": max_case_time,
               "cases": [c if isinstance(c, dict) else c.to_dict() for c in cases]}
    info = {"status": "failed", "python": python, "what": what}
    results = {}
    with tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen([python, os.path.join(HERE, script)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, env=env, text=True,
                                    cwd=tempfile.gettempdir())
        except OSError as e:
            info["error"] = f"cannot start {python}: {e}"
            return info, results
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        t0 = time.perf_counter()
        try:
            proc.stdin.write(json.dumps(request))
            proc.stdin.close()
            for line in proc.stdout:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                ev = msg.pop("event", None)
                if ev == "start":
                    info.update(status="ran", version=msg.get("version"),
                                threads=msg.get("threads"), python=msg.get("python"))
                elif ev == "missing":
                    info.update(status="missing", error=msg.get("error"))
                elif ev == "case":
                    results[msg.pop("name")] = msg
                    if on_case:
                        on_case(peer, len(results))
                elif ev == "done":
                    info["complete"] = True
            proc.wait()
        except BrokenPipeError:
            proc.wait()
        finally:
            timer.cancel()
        info["wall_s"] = time.perf_counter() - t0
        if info["status"] != "missing" and (proc.returncode != 0 or not info.get("complete")):
            err.seek(0)
            tail = err.read()[-1500:].strip()
            if proc.returncode in (-9, 137):
                why = f"killed after the {timeout:g} s timeout"
            else:
                why = f"exited with code {proc.returncode}"
            if info["status"] == "ran":
                info["error"] = f"{why} after {len(results)} of {len(cases)} cases"
                info["partial"] = True
            else:
                info["error"] = f"{why}: {tail.splitlines()[-1] if tail else 'no output'}"
            info["stderr_tail"] = tail
    return info, results


def run_peers(cases, names, python=None, threads=2, repeats=15, min_time=2e-3,
              max_case_time=5.0, timeout=900.0, progress=True):
    """Run several peers one after the other (never concurrently).

    Parameters
    ----------
    cases : sequence of numbasep.suite.Case
    names : sequence of str
        Keys of :data:`PEERS`.
    python, threads, repeats, min_time, max_case_time, timeout
        As in :func:`run_peer`.
    progress : bool
        Report progress and missing peers on stderr.

    Returns
    -------
    dict
        ``info``: peer -> info dict, ``results``: peer -> {case name -> timing}.
    """
    out = {"info": {}, "results": {}}
    total = len(cases)

    def tick(peer, n):
        if progress:
            print(f"[{peer} {n}/{total}]", file=sys.stderr, flush=True)

    for name in names:
        if progress:
            print(f"running peer {name} ({python or sys.executable})...", file=sys.stderr,
                  flush=True)
        info, res = run_peer(name, cases, python=python, threads=threads, repeats=repeats,
                             min_time=min_time, max_case_time=max_case_time, timeout=timeout,
                             on_case=tick)
        out["info"][name] = info
        out["results"][name] = res
        if progress and info["status"] != "ran":
            print(f"peer {name}: {info['status']} - {info.get('error')}", file=sys.stderr,
                  flush=True)
    return out

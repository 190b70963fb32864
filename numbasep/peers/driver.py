"""Run the peers, each in its own process, on the cases numbasep ran.

Why separate processes: TensorFlow's and PyTorch's thread pools keep spinning
after a call and steal the cores from Numba's threads (40 ms stalls were seen
with TensorFlow and numba in one process), and the peers need not be installed
in numbasep's environment at all: ``python`` may be another virtual
environment's interpreter.

Each peer gets the same cases (as :meth:`numbasep.suite.Case.to_dict`), the
same thread count (thread-pool settings, ``OMP_NUM_THREADS`` and friends, and a
CPU affinity of that many CPUs) and the same timing protocol
(:mod:`numbasep.peers._harness`).

The contenders are timed side by side (:func:`interleave`): every peer process
stays up for the whole run, and the samples of one case are taken in rounds,
each contender in turn, so that a slow stretch of a shared machine (other
tenants' memory traffic slowed this development VM's large cases twofold for
minutes at a time) falls on all of them alike rather than on whoever was being
timed then.

Examples
--------
>>> from numbasep.peers import driver
>>> sorted(driver.PEERS)
['jax', 'tf-eigen', 'tf-onednn', 'torch']
"""

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

from ._harness import limit_threads_env, repeats_within, summarize

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


class PeerGone(Exception):
    """The peer process exited, or did not answer in time."""


class Runner:
    """One peer in a child process that serves the protocol of
    :mod:`numbasep.peers._harness` until :meth:`close`.

    Parameters
    ----------
    peer : str
        A key of :data:`PEERS`.
    python : str, optional
        Interpreter for the child (default: the current one).
    threads : int
        Threads the peer may use.
    timeout : float
        Seconds to wait for any one answer (the start, a case's build and
        warm-up, a round of samples) before the child is killed.

    Attributes
    ----------
    name : str
    info : dict
        ``status`` (``"ran"``, ``"missing"``: the framework is not importable by
        that interpreter, or ``"failed"``), and ``version``, ``threads``,
        ``python``, ``error``, ``what`` as known.
    """

    def __init__(self, peer, python=None, threads=2, timeout=900.0):
        self.name, self.timeout = peer, timeout
        python = python or sys.executable
        script, extra, what = PEERS[peer]
        env = limit_threads_env(threads)
        env.update(extra)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.info = {"status": "failed", "python": python, "what": what}
        self._err = tempfile.TemporaryFile("w+")
        self._lines = queue.Queue()
        self._proc = None
        try:
            self._proc = subprocess.Popen(
                [python, os.path.join(HERE, script)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._err, env=env, text=True,
                cwd=tempfile.gettempdir())
        except OSError as e:
            self.info["error"] = f"cannot start {python}: {e}"
            return
        threading.Thread(target=self._read, daemon=True).start()
        try:
            msg = self._ask({"peer": peer, "threads": threads}, ("start", "missing"))
        except PeerGone as e:
            self.info["error"] = str(e)
            return
        if msg["event"] == "missing":
            self.info.update(status="missing", error=msg.get("error"))
            self.close()
        else:
            self.info.update(status="ran", version=msg.get("version"),
                             threads=msg.get("threads"), python=msg.get("python"))

    @property
    def alive(self):
        """Whether the child is up and serving."""
        return self._proc is not None and self.info["status"] == "ran"

    def _read(self):
        for line in self._proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                try:
                    self._lines.put(json.loads(line))
                except ValueError:
                    pass
        self._lines.put(None)                       # end of output: the child exited

    def _ask(self, request, events):
        """Send ``request``; the first answer whose event is in ``events``."""
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise PeerGone(self._gone("exited")) from None
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                msg = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._proc.kill()
                raise PeerGone(self._gone(f"killed after the {self.timeout:g} s timeout"))
            if msg is None:
                raise PeerGone(self._gone("exited"))
            if msg.get("event") in events:
                return msg

    def _gone(self, why):
        self._proc.wait()
        self._err.seek(0)
        tail = self._err.read()[-1500:].strip()
        if why == "exited":
            why = f"exited with code {self._proc.returncode}"
        self.info["stderr_tail"] = tail
        return f"{why}: {tail.splitlines()[-1] if tail else 'no output'}"

    def prepare(self, case, min_time=2e-3):
        """Build ``case`` and warm it up: :func:`numbasep.peers._harness.calibrate`'s
        dict, or one with ``unsupported`` or ``error``."""
        msg = self._ask({"cmd": "case", "case": case if isinstance(case, dict)
                         else case.to_dict(), "min_time": min_time}, ("ready", "case"))
        msg.pop("event")
        msg.pop("name", None)
        return msg

    def samples(self, count, warm_s=0.0):
        """``count`` samples of the prepared case (seconds per call), after
        ``warm_s`` seconds of untimed calls."""
        return self._ask({"cmd": "samples", "count": count, "warm_s": warm_s},
                         ("samples",))["times"]

    def end(self):
        """Drop the prepared case."""
        self._ask({"cmd": "end"}, ("ended",))

    def fail(self, error):
        """Record that the peer went away after it started (the cases it ran keep
        their results) and stop it."""
        self.info.update(error=error, partial=True)
        self.close()

    def close(self):
        """Stop the child process (it finishes its current command first)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._err.close()


def start_peers(names, python=None, threads=2, timeout=900.0, progress=True):
    """Start a :class:`Runner` for each of ``names``; a dict name -> runner (the
    missing and failed ones too, with their ``info``)."""
    runners = {}
    for name in names:
        if progress:
            print(f"starting peer {name} ({python or sys.executable})...", file=sys.stderr,
                  flush=True)
        r = runners[name] = Runner(name, python=python, threads=threads, timeout=timeout)
        if progress and not r.alive:
            print(f"peer {name}: {r.info['status']} - {r.info.get('error')}", file=sys.stderr,
                  flush=True)
    return runners


#: Rounds the samples of one case are split into, each contender in turn.
ROUNDS = 3

#: Seconds of untimed calls that open each contender's round: after another
#: process ran, a large case's first calls are slower. On this 2-core VM, N = 32
#: 56x56x144 stride-2 forward, the three samples of a round after one untimed
#: call (ms): numbasep 3.6, 2.8, 1.8, PyTorch 3.6, 2.0, 1.5; after 30 ms of
#: calls: 1.5, 1.6, 1.5 and 1.3, 1.4, 1.4, as when each is timed alone. The
#: untimed calls also outlast the previous contender's spinning thread pools, so
#: no pause is left between turns: a pause lets the whole VM go idle, and then
#: numbasep's samples were disturbed (over 1.5x the case's best) six times as
#: often (26 of 243 against 4 with no pause, N = 8 maps of 28x28 and less).
WARM = 0.05

def interleave(case, contenders, repeats=15, min_time=2e-3, max_case_time=5.0,
               rounds=ROUNDS, warm_s=WARM):
    """Time one case on every contender, side by side.

    Every contender builds and warms up the case first; then its ``repeats``
    samples (fewer, at least 3, for a slow case: ``max_case_time`` each) are
    taken in ``rounds`` rounds, the contenders taking turns in each round in an
    order rotated from one round to the next, each turn opened by ``warm_s``
    seconds of untimed calls.

    Parameters
    ----------
    case : numbasep.suite.Case
    contenders : sequence
        Objects with ``name`` and the methods ``prepare(case, min_time)``,
        ``samples(count)`` and ``end()`` of :class:`Runner`; a method may raise
        :class:`PeerGone`, which drops that contender from the case (the
        exception is in the result as ``gone``).

    Returns
    -------
    dict
        Contender name -> the fields of
        :func:`numbasep.peers._harness.time_call`, or a dict with
        ``unsupported``, ``error`` or ``gone``.
    """
    out, plan = {}, {}
    for c in contenders:
        try:
            cal = c.prepare(case, min_time)
        except PeerGone as e:
            out[c.name] = {"gone": e}
            continue
        if "number" not in cal:
            out[c.name] = cal
            continue
        n = repeats_within(repeats, cal["single_s"] * cal["number"], max_case_time)
        plan[c.name] = (c, n, cal)
        out[c.name] = []
    rounds = max(1, min(rounds, repeats))
    for r in range(rounds):
        names = list(plan)
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            c, n, _ = plan[name]
            count = n // rounds + (r < n % rounds)
            if not count:
                continue
            try:
                out[name] += c.samples(count, warm_s)
            except PeerGone as e:
                out[name] = {"gone": e}
                del plan[name]
    for name, (c, n, cal) in plan.items():
        try:
            c.end()
        except PeerGone as e:
            out[name] = {"gone": e}
            continue
        res = summarize(out[name])
        res.update(first_call_s=cal["first_call_s"], number=cal["number"], repeats=n)
        out[name] = res
    return out

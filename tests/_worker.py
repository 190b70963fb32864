"""A crash-proof, reusable subprocess that executes numbasep calls described as data.

The adversarial tests (``test_adversarial.py``) and the index-safety and
regression tests that probe for hangs run every generated call through a
:class:`Worker`: a persistent child Python process that reads pickled *cases*
from a pipe, executes each one and answers with a pickled *outcome*. A case
that kills the child (segfault, abort, out-of-memory kill) or runs past its
timeout (a hang) is reported as such and the child is restarted; the test
process itself is never at risk. The child is reused across cases, so numba
compiles (or loads from its cache) each kernel once.

Cases are plain data, so that both sides can rebuild exactly the same
arguments: an array argument is an :class:`Arr` recipe (shape, dtype, values,
memory layout, container kind, host or CUDA device), never the array itself
(pickling an array would lose read-only flags, strides and zero-stride
broadcasting, which are part of what is tested).

Protocol: 8-byte little-endian length, then a pickle, in both directions. The
child answers on a private copy of its original stdout; its fd 1 is pointed at
stderr, so a library that prints cannot corrupt the protocol. stderr goes to a
temporary file whose tail is reported when the child dies.
"""

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# --------------------------------------------------------------------------- recipes


class Arr:
    """Recipe for an array argument.

    Parameters
    ----------
    shape : tuple of int
        Logical shape (dimensions may be huge when another one is 0).
    dtype : str
        A NumPy dtype spelling ("float32", ">f4", "object", ...) or "bfloat16".
    seed : int
        Values are uniform in [-1, 1) from ``numpy.random.default_rng(seed)``.
    special : str
        "" (finite values), "nan", "inf", "nan+inf": a few entries replaced.
    layout : str
        "c" (C-contiguous), "f" (Fortran order), "strided" (every other
        element of a bigger buffer), "reversed" (negative strides),
        "transposed" (a transposed view), "broadcast" (zero strides, read-only),
        "guarded" (C-contiguous, followed in memory by a guard region of NaN
        that the worker checks after the call: an out-of-bounds write shows).
    readonly : bool
    kind : str
        "ndarray", "list" (nested Python lists), "scalar" (a NumPy scalar of the
        array's first element, or of 0.5), "pyfloat", "masked" (numpy.ma array),
        "device" (a CUDA device array), "device_strided" (a strided device view).
    """

    __slots__ = ("shape", "dtype", "seed", "special", "layout", "readonly", "kind")

    def __init__(self, shape, dtype="float32", seed=0, special="", layout="c",
                 readonly=False, kind="ndarray"):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.seed = seed
        self.special = special
        self.layout = layout
        self.readonly = readonly
        self.kind = kind

    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state):
        for k, v in state.items():
            setattr(self, k, v)

    def replace(self, **changes):
        state = self.__getstate__()
        state.update(changes)
        return Arr(**state)

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self):
        extra = "".join(f", {k}={getattr(self, k)!r}" for k, d in
                        (("special", ""), ("layout", "c"), ("readonly", False),
                         ("kind", "ndarray")) if getattr(self, k) != d)
        return f"Arr({self.shape}, {self.dtype!r}, seed={self.seed}{extra})"


class Iter:
    """An iterator over ``items`` (a one-shot iterable argument)."""

    def __init__(self, items):
        self.items = list(items)

    def __repr__(self):
        return f"Iter({self.items!r})"


class Special:
    """A non-array object by name: "object", "dict", "set", "bytes", "ellipsis"."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Special({self.name!r})"


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    if name == "float8_e4m3fn":
        import ml_dtypes
        return np.dtype(ml_dtypes.float8_e4m3fn)
    return np.dtype(name)


def _values(spec, shape):
    """Values of the recipe's dtype for ``shape`` (a C-contiguous array)."""
    rng = np.random.default_rng(spec.seed)
    v = rng.uniform(-1, 1, size=shape)
    dt = np_dtype(spec.dtype)
    if dt.kind == "f" or spec.dtype in ("bfloat16", "float8_e4m3fn"):
        if spec.special and v.size:
            flat = v.reshape(-1)
            k = max(1, flat.size // 7)
            idx = rng.choice(flat.size, size=min(k, flat.size), replace=False)
            for j, i in enumerate(idx):
                if spec.special == "nan" or (spec.special == "nan+inf" and j % 2 == 0):
                    flat[i] = np.nan
                else:
                    flat[i] = np.inf if j % 3 else -np.inf
        return v.astype(dt)
    if dt.kind == "b":
        return v > 0
    if dt.kind in "iu":
        return (v * 10).astype(dt)
    if dt.kind == "c":
        return (v + 1j * v[::-1] if v.ndim else v + 0.5j).astype(dt)
    if dt.kind == "O":
        return v.astype(object)
    if dt.kind in "US":
        return v.astype(dt)
    return v.astype(dt)


def host_array(spec):
    """The NumPy array a recipe describes (before any container conversion)."""
    shape = spec.shape
    layout = spec.layout
    if spec.size == 0 or layout == "c" or not shape:
        a = _values(spec, shape)
        if layout == "broadcast":
            a = np.broadcast_to(a, shape)
    elif layout == "f":
        a = np.asfortranarray(_values(spec, shape))
    elif layout == "strided":
        big = list(shape)
        big[-1] = 2 * big[-1] if big else 1
        a = _values(spec, tuple(big))[..., ::2] if shape else _values(spec, shape)
    elif layout == "reversed":
        a = _values(spec, shape)
        if a.ndim:
            a = a[::-1]
    elif layout == "transposed":
        a = _values(spec, shape[::-1]).T
    elif layout == "broadcast":
        small = tuple(1 if i % 2 == 0 else s for i, s in enumerate(shape))
        a = np.broadcast_to(_values(spec, small), shape)
    elif layout == "guarded":
        v = _values(spec, shape)
        n = v.size
        big = np.full(2 * n + GUARD, np.nan, v.dtype)
        a = big[:n].reshape(shape)
        a[...] = v
        _GUARDS.append((big, n, spec))
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if spec.readonly and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


GUARD = 64          # elements of guard after a "guarded" array, beyond its own size
_GUARDS = []        # (buffer, size, recipe) of the guarded arrays of the current case


def check_guards():
    """Recipes whose guard region was written (by an out-of-bounds write)."""
    bad = []
    for big, n, spec in _GUARDS:
        tail = big[n:]
        if not np.isnan(tail.astype(np.float64)).all():
            hit = np.flatnonzero(~np.isnan(tail.astype(np.float64)))
            bad.append(f"{spec!r}: {hit.size} element(s) written past its end, at offsets "
                       f"{hit[:8].tolist()}")
    _GUARDS.clear()
    return bad


def build(value, backend="cpu", device=True):
    """Materialise a case value: recipes become arrays, containers are rebuilt.

    ``device=False`` builds host copies of device recipes (for the reference).
    """
    if isinstance(value, Arr):
        a = host_array(value)
        kind = value.kind
        if kind in ("device", "device_strided"):
            if not device:
                return a
            from numbasep.backends.cuda.transfer import to_device   # bfloat16 too
            if kind == "device_strided" and a.ndim and a.size:
                big = np.concatenate([a[..., None], a[..., None]], axis=-1)
                big = big.reshape(a.shape[:-1] + (2 * a.shape[-1],))
                d = to_device(np.ascontiguousarray(big))
                return d[..., ::2]
            return to_device(np.ascontiguousarray(a))
        if kind == "list":
            return a.tolist()
        if kind == "scalar":
            return a.reshape(-1)[0] if a.size else a.dtype.type(0.5)
        if kind == "pyfloat":
            return 0.5
        if kind == "masked":
            return np.ma.masked_array(a)
        return a
    if isinstance(value, Iter):
        return iter([build(v, backend, device) for v in value.items])
    if isinstance(value, Special):
        return {"object": object(), "dict": {"a": 1}, "set": {1, 2, 3, 4},
                "bytes": b"SAME", "ellipsis": Ellipsis}[value.name]
    if isinstance(value, list):
        return [build(v, backend, device) for v in value]
    if isinstance(value, tuple):
        return tuple(build(v, backend, device) for v in value)
    return value


class Case:
    """One call: ``op`` (a name in :data:`OPS`) with keyword arguments ``kwargs``."""

    def __init__(self, op, kwargs, note=""):
        self.op = op
        self.kwargs = kwargs
        self.note = note

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.op}({args})" + (f"  # {self.note}" if self.note else "")


OPS = (
    "depthwise_conv2d_native",
    "depthwise_conv2d_native_backprop_input",
    "depthwise_conv2d_native_backprop_filter",
    "raw_ops.DepthwiseConv2dNative",
    "raw_ops.DepthwiseConv2dNativeBackpropInput",
    "raw_ops.DepthwiseConv2dNativeBackpropFilter",
    "depthwise_conv",
    "separable_conv",
    "depthwise_conv_grad",
    "separable_conv_grad",
)


def function(op):
    import numbasep
    obj = numbasep
    for part in op.split("."):
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------- child side

def _describe_result(r, outs):
    """(kind, dtype name, shape, float64 values, is the caller's out) of one result."""
    is_out = any(r is o for o in outs if o is not None)
    if isinstance(r, np.ndarray):
        kind, host = "ndarray", r
    elif hasattr(r, "copy_to_host"):
        kind, host = "device", r.copy_to_host()
    else:
        return (f"{type(r).__module__}.{type(r).__qualname__}", None, None, None, is_out)
    dt = host.dtype
    vals = host.astype(np.float64) if dt.kind == "f" or dt.name == "bfloat16" else host
    return (kind, dt.name if dt.isnative else dt.str, tuple(host.shape), vals, is_out)


def run_case(case):
    """Execute one case; return the outcome (never raises)."""
    import numbasep
    t0 = time.perf_counter()
    _GUARDS.clear()
    try:
        kwargs = {k: build(v) for k, v in case.kwargs.items()}
        out = kwargs.get("out")
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
    except Exception as e:  # a recipe the test could not build: the test's bug
        return ("setup-error", f"{type(e).__name__}: {e}", traceback.format_exc())
    try:
        r = function(case.op)(**kwargs)
    except Exception as e:
        bad = check_guards()
        if bad:
            return ("corrupt", "; ".join(bad), "")
        return ("raise", f"{type(e).__module__}.{type(e).__qualname__}", str(e),
                isinstance(e, numbasep.InvalidArgumentError), isinstance(e, TypeError),
                traceback.format_exc(), time.perf_counter() - t0)
    bad = check_guards()
    if bad:
        return ("corrupt", "; ".join(bad), "")
    results = r if isinstance(r, tuple) else (r,)
    return ("ok", isinstance(r, tuple), [_describe_result(x, outs) for x in results],
            time.perf_counter() - t0)


def _read_exact(f, n):
    data = b""
    while len(data) < n:
        chunk = f.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def serve():
    """Child main loop: answer ("case", Case) and ("warm", [Case]) requests."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    limit = os.environ.get("NUMBASEP_WORKER_RLIMIT_AS")
    if limit:
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = int(limit) if hard == resource.RLIM_INFINITY else min(int(limit), hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        # The simulator's block barriers poll under the GIL: a short switch
        # interval makes its kernels several times faster.
        sys.setswitchinterval(1e-4)
        from simulator import make_shared_arrays_thread_safe
        make_shared_arrays_thread_safe()
    import numbasep  # noqa: F401  (imported once, before the first case)
    while True:
        try:
            (n,) = struct.unpack("<Q", _read_exact(inp, 8))
            kind, payload = pickle.loads(_read_exact(inp, n))
        except EOFError:
            return
        if kind == "case":
            answer = run_case(payload)
        elif kind == "warm":
            answer = [run_case(c)[0] for c in payload]
        elif kind == "threads":
            import numba
            numba.set_num_threads(payload)
            answer = numba.get_num_threads()
        else:
            answer = ("setup-error", f"unknown request {kind!r}", "")
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(struct.pack("<Q", len(data)) + data)


# --------------------------------------------------------------------------- parent side

class Worker:
    """Parent-side handle of the child process.

    Parameters
    ----------
    env : dict, optional
        Extra environment variables for the child (e.g. ``NUMBASEP_MAX_BYTES``).
    warm : list of Case, optional
        Calls run (without a tight timeout) every time a child starts, so that
        kernel compilation does not count against per-case timeouts.
    """

    def __init__(self, env=None, warm=(), warm_timeout=900.0):
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.warm = list(warm)
        self.warm_timeout = warm_timeout
        self.proc = None
        self.restarts = 0
        self.cases = 0

    # -- process management -------------------------------------------------------
    def start(self):
        self._err = tempfile.TemporaryFile()
        code = (f"import sys; sys.path.insert(0, {HERE!r}); "
                f"import _worker; _worker.serve()")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, env=self.env,
                                     cwd=os.path.dirname(HERE))
        if self.warm:
            status, answer = self._request(("warm", self.warm), self.warm_timeout)
            if status != "answer":
                raise RuntimeError(f"the worker could not warm up: {status} {answer}")

    def stop(self):
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def _kill(self):
        p, self.proc = self.proc, None
        if p is not None:
            p.kill()       # our own child, by its handle
            p.wait()

    def _stderr_tail(self, n=3000):
        try:
            self._err.seek(0)
            return self._err.read().decode(errors="replace")[-n:]
        except (OSError, ValueError):
            return ""

    def _request(self, message, timeout):
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._died()
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        need = 8
        size = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                tail = self._stderr_tail()
                self._kill()
                self.restarts += 1
                return "hang", (timeout, tail)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, max(65536, need - len(buf)))
            if not chunk:
                return self._died()
            buf += chunk
            if size is None and len(buf) >= 8:
                (size,) = struct.unpack("<Q", buf[:8])
                need = 8 + size
            if size is not None and len(buf) >= need:
                return "answer", pickle.loads(buf[8:need])

    def _died(self):
        p = self.proc
        rc = p.wait() if p is not None else None
        self.proc = None
        self.restarts += 1
        sig = ""
        if rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = str(-rc)
        return "crash", (rc, sig, self._stderr_tail())

    # -- requests -------------------------------------------------------------------
    def run(self, case, timeout=30.0, retry_timeout=None):
        """Outcome of ``case``: ("ok", ...), ("raise", ...), ("crash", ...), ("hang", ...).

        A case that times out is retried once in a fresh (warmed-up) child with
        ``retry_timeout`` before it is called a hang, so that an unexpected
        compilation is not mistaken for one.
        """
        self.cases += 1
        status, answer = self._request(("case", case), timeout)
        if status == "hang" and retry_timeout:
            status, answer = self._request(("case", case), retry_timeout)
        if status == "answer":
            return answer
        return (status,) + tuple(answer)

    def set_threads(self, n, timeout=60.0):
        status, answer = self._request(("threads", n), timeout)
        return answer if status == "answer" else None


if __name__ == "__main__":
    serve()

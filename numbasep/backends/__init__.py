"""The backend registry: which backend computes on which kind of array.

A backend registers a name, a predicate on Python *types* that says which array
types it owns, and a loader that imports it. The public operators never name a
backend: they hand their array arguments to :func:`select`, which classifies
each argument's type once (the answer is memoised per type, so dispatch is a
dict lookup), insists that all arguments belong to one backend, and loads that
backend on first use. Classification looks only at a type's attributes and
module name, so it never imports CuPy, PyTorch or numba's CUDA target: a
program that only passes NumPy arrays never loads ``numba.cuda``.

Built in: ``cpu`` owns NumPy arrays (and Python scalars and sequences, read with
``numpy.asarray``); ``cuda`` owns objects exposing ``__cuda_array_interface__``
(numba device arrays, CuPy arrays, PyTorch tensors) and the CUDA simulator's
device arrays (``__cuda_ndarray__``). PyTorch declares the interface on its
tensor *type*, so CPU tensors are classified ``cuda`` too; the CUDA backend
rejects them with a TypeError that says what to pass instead.

Examples
--------
>>> import numpy as np
>>> from numbasep import backends
>>> backends.backend_name(np.zeros(3))
'cpu'
>>> be, (x,) = backends.select(x=np.zeros(3))
>>> be.name
'cpu'
>>> backends.select(x=np.zeros(3), w={})
Traceback (most recent call last):
...
TypeError: w is a builtins.dict, which no numbasep backend accepts; ...
"""

import importlib

import numpy as np

_registry = []     # (name, owns_type, module path) in priority order
_by_type = {}      # type -> backend name or None (memo)
_loaded = {}       # name -> Backend instance

_SUPPORTED = (
    "NumPy arrays (computed on the CPU) or CUDA arrays: numba device arrays, CuPy "
    "arrays, PyTorch CUDA tensors or any object exposing __cuda_array_interface__ "
    "(computed on the GPU)")


def register(name, owns_type, module, first=False):
    """Register a backend.

    Parameters
    ----------
    name : str
        Short name, e.g. ``"cpu"``.
    owns_type : callable
        ``owns_type(t) -> bool`` for a Python type ``t``; must not import heavy modules.
    module : str
        Import path of a module with a ``backend()`` function returning the
        :class:`~numbasep.backends.base.Backend` instance (imported on first use).
    first : bool
        Consult this backend before the ones already registered.
    """
    entry = (name, owns_type, module)
    _registry[:] = [e for e in _registry if e[0] != name]
    if first:
        _registry.insert(0, entry)
    else:
        _registry.append(entry)
    _by_type.clear()
    _by_types.clear()
    _loaded.pop(name, None)


def names():
    """Names of the registered backends, in the order they are consulted."""
    return [e[0] for e in _registry]


def backend_name(obj):
    """Name of the backend that owns ``obj``, or None when no backend does.

    The answer depends only on ``type(obj)`` and is memoised per type.
    """
    t = type(obj)
    try:
        return _by_type[t]
    except KeyError:
        pass
    found = None
    for name, owns, _ in _registry:
        if owns(t):
            found = name
            break
    _by_type[t] = found
    return found


def get(name):
    """The backend instance called ``name``, importing it on first use."""
    try:
        return _loaded[name]
    except KeyError:
        pass
    for n, _, module in _registry:
        if n == name:
            be = importlib.import_module(module).backend()
            _loaded[name] = be
            return be
    raise KeyError(f"no backend named {name!r}; registered: {names()}")


def _describe(obj):
    """``module.Type``, plus the device when the object names one (no imports)."""
    t = type(obj)
    text = f"{t.__module__}.{t.__qualname__}"
    if t.__module__.partition(".")[0] in ("torch", "cupy", "jax", "jaxlib"):
        try:
            text += f" on device {obj.device}"
        except Exception:  # describing must never fail
            pass
    return text


def _hint(where):
    for _, name, obj in where:
        if name == "cuda" and type(obj).__module__.partition(".")[0] == "torch" \
                and str(getattr(obj, "device", "")).startswith("cpu"):
            return (" (PyTorch CPU tensors are not CPU arrays for numbasep: pass "
                    "tensor.numpy() to compute on the CPU, or tensor.cuda() for the GPU)")
    return ""


def select(**arrays):
    """Pick the backend for the named array arguments and convert them to its arrays.

    Parameters
    ----------
    **arrays
        The operator's array arguments, by name (the names appear in errors).

    Returns
    -------
    backend : Backend
    natives : tuple
        The arguments as the backend's own array type, in the order given.

    Raises
    ------
    TypeError
        When an argument's type belongs to no backend, or the arguments belong to
        different backends; the message names every argument and where it is.
    """
    types = tuple(map(type, arrays.values()))
    name = _by_types.get(types)
    if name is None:
        name = _choose(arrays)
        _by_types[types] = name
    be = get(name)
    return be, tuple(be.prepare(obj, arg) for arg, obj in arrays.items())


# The backend chosen for each tuple of argument types (errors are never stored).
_by_types = {}


def _choose(arrays):
    """Name of the one backend owning every array in ``arrays``, or TypeError."""
    where = [(arg, backend_name(obj), obj) for arg, obj in arrays.items()]
    for arg, name, obj in where:
        if name is None:
            raise TypeError(
                f"{arg} is a {_describe(obj)}, which no numbasep backend accepts; "
                f"supported: {_SUPPORTED}")
    chosen = {name for _, name, _ in where}
    if len(chosen) > 1:
        listing = ", ".join(f"{a} ({_describe(o)}) on {n}" for a, n, o in where)
        raise TypeError(
            f"all array arguments must live on one device, got {listing}; move them "
            f"to one device first (e.g. numba.cuda.to_device(a) / a.copy_to_host(), "
            f"cupy.asarray(a) / a.get(), tensor.cuda() / tensor.cpu().numpy()){_hint(where)}")
    if not where:
        raise TypeError("select() needs at least one array argument")
    return where[0][1]


def _owns_cpu(t):
    return issubclass(t, (np.ndarray, np.generic, list, tuple, int, float))


def _owns_cuda(t):
    # Attributes of the *type*: a property on the class counts, and nothing is
    # called, so classifying a CuPy or PyTorch type imports nothing.
    return hasattr(t, "__cuda_array_interface__") or hasattr(t, "__cuda_ndarray__")


register("cpu", _owns_cpu, "numbasep.backends.cpu")
register("cuda", _owns_cuda, "numbasep.backends.cuda")

"""Parallel kernels that call their per-task code through its address.

A Numba parallel kernel is compiled in four libraries, each linking the one
below: the prange body's gufunc, its wrapper, the parallel launcher and the
kernel itself. Numba optimises and generates machine code for each library with
everything it links, so a kernel whose body calls the lane intrinsics compiled
that code four times over (lanes 3x3 filter gradient, fresh cache: 23 s, 18 of
them in LLVM; each level about 0.9 s of optimisation and 2.7 of code
generation).

Here the task (one part of a kernel's work, a plain ``@njit`` function taking
the part's index and the number of parts first) is compiled once, on its own,
and a small parallel launcher calls it by address: :class:`Parallel`. The
launcher is compiled per argument signature, not per task, so kernels of
different windows share it. A task's address travels as an integer argument
(Numba's cache keeps no addresses), its signature as a compile-time constant of
the launcher; the call checks the arguments' types against it when the
launcher compiles, so a launch with other types is a typing error, never a call
with the wrong layout. Compiling one problem of each kernel family with an
empty cache (2-D, both layouts, float32 and float16, multiplier 2) took 300 s
before, 143 s with the lane, tile and row kernels as tasks.

The plane kernels (:mod:`.planes`) stay prange bodies: as tasks they ran 20-35 %
slower (1 thread, N=8 56x56x144 channels-first forward 2.0 -> 2.7 ms; neither
Numba's ``noalias`` flag nor its numpy error model, the two flags its parallel
bodies are compiled with, gave it back).
"""

import hashlib

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, typeof, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.core.imputils import lower_constant
from numba.extending import intrinsic, models, register_model, typeof_impl

from .cache_key import instance as _instance


class TaskType(types.Type):
    """The Numba type of a :class:`_Signature`: a task signature known when
    the launcher compiles."""

    def __init__(self, sig):
        self.sig = sig
        super().__init__(name=f"Task{sig}")


register_model(TaskType)(models.OpaqueModel)


class _Signature:
    """A task's signature as a launcher's compile-time constant (a closure
    variable, so part of the launcher's cache key).

    Numba's cache key hashes the pickled closure variables, so this pickles as
    the signature's text: Numba's type objects pickle with a number that depends
    on the order a process created them in, and the launchers missed the cache
    in every new process."""

    _made = {}

    def __init__(self, sig):
        self.sig = sig
        _Signature._made[str(sig)] = sig

    def __reduce__(self):
        return _Signature._named, (str(self.sig),)

    @staticmethod
    def _named(text):
        return _Signature(_Signature._made[text])


@typeof_impl.register(_Signature)
def _typeof_signature(val, c):
    return TaskType(val.sig)


@lower_constant(TaskType)
def _lower_signature(context, builder, ty, pyval):
    return context.get_dummy_value()


@intrinsic
def _call(typingctx, task, address, args):
    """Call the task at ``address`` (int64) with the tuple ``args``; ``task``:
    its signature."""
    if not isinstance(task, TaskType) or not isinstance(args, types.BaseTuple):
        return None
    sig = task.sig
    if tuple(args) != tuple(sig.args):
        raise TypingError(f"task arguments {tuple(args)} do not match its signature "
                          f"{tuple(sig.args)}")

    def codegen(context, builder, signature, llargs):
        values = [builder.extract_value(llargs[2], i) for i in range(len(sig.args))]
        fnty = context.call_conv.get_function_type(sig.return_type, sig.args)
        fn = builder.inttoptr(llargs[1], fnty.as_pointer())
        status, _ = context.call_conv.call_function(builder, fn, sig.return_type, sig.args,
                                                    values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()
    return types.none(task, address, args), codegen


@intrinsic
def threads(typingctx):
    """The number of threads Numba runs parallel code on (in compiled code), from
    the threading layer's ``get_num_threads`` by name, as Numba's own parallel
    loops ask for it: ``numba.get_num_threads`` in compiled code calls it by
    address, which keeps a function from the cache."""
    numba.get_num_threads()          # the threading layer is loaded, its symbols known

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            context.get_value_type(types.intp), []), "get_num_threads")
        return builder.call(fn, [])
    return types.intp(), codegen


_launchers = {}


def _launcher(sig, per_thread=False):
    """The parallel launcher of tasks of signature ``sig`` (the task's index and
    the number of tasks first). ``per_thread``: its count is the most tasks,
    and it runs at most one per thread of Numba's (asked for in compiled code,
    where that costs nothing; from Python it costs about a microsecond)."""
    if (sig, per_thread) not in _launchers:
        task = _Signature(sig)

        # per_thread: a compile-time constant, as task is (both part of the cache key;
        # the symbol's name too, _instance)
        @njit(parallel=True, nogil=True, cache=True)
        @_instance("per_thread" if per_thread else "each",
                   hashlib.sha256(repr(sig).encode()).hexdigest()[:16])
        def launch(address, most, *args):
            count = min(most, np.int64(threads())) if per_thread else most
            for i in prange(count):
                _call(task, address, (np.int64(i), count) + args)
        _launchers[sig, per_thread] = launch
    return _launchers[sig, per_thread]


# The ndarray flags Numba's type of an array depends on: C_CONTIGUOUS,
# F_CONTIGUOUS, ALIGNED, WRITEABLE (``flags.num`` holds them all, one attribute).
_TYPE_FLAGS = 0x1 | 0x2 | 0x100 | 0x400


def _no_aliases(task):
    """Have ``task`` compiled with its array arguments declared not to overlap
    (Numba's ``noalias`` flag, which the decorator has no option for), so that
    LLVM may keep values in registers across stores and vectorise loops that
    store into one array and read another. The operators refuse an ``out=``
    that overlaps an input, and the driver's buffers are its own. 2 threads, the
    row kernels, N=8 56x56x12 3x3, min of 3 interleaved rounds: forward 0.55 ms
    as a prange body, 0.32 as a task with it; filter gradient 0.47 / 0.37 (0.52
    as a task without it)."""
    compiler = task._compiler
    customize = compiler._customize_flags

    def flags_without_aliases(flags):
        flags = customize(flags)
        flags.noalias = True
        return flags
    compiler._customize_flags = flags_without_aliases


class Parallel:
    """A parallel kernel: ``kernel(*args)`` runs ``task(i, count, *args)`` for
    i in range(count) in parallel, ``count = count_of(*args)``; ``task`` an
    ``@njit`` function, compiled once per signature of ``args``, whose first
    ``arrays`` arguments are NumPy arrays and the others Python ints.

    ``per_thread``: ``count`` is at most the number of threads Numba runs
    parallel code on, ``count_of`` giving the most. Numba hands each thread one
    equal, contiguous range of a parallel loop, so tasks beyond the thread count
    balance nothing; they only repeat the set-up a task does once (its scratch,
    and in :mod:`.tiles` the filter taps of its first block).

    A call looks its task up by what the arrays' Numba types depend on, so a
    launch costs a microsecond or so more than a parallel kernel's own (the
    ints' types are taken as they were at the first call; a launch with other
    types is a typing error when the launcher compiles for them, not a call
    with the wrong layout)."""

    def __init__(self, task, count_of, arrays, per_thread=False):
        self.task, self.count_of, self.arrays = task, count_of, arrays
        self.per_thread = per_thread
        self.py_func = task.py_func
        self.__doc__ = task.__doc__
        self._compiled = {}
        _no_aliases(task)

    def __call__(self, *args):
        key = tuple([(a.dtype, a.ndim, a.flags.num & _TYPE_FLAGS) for a in args[:self.arrays]])
        try:
            launch, address = self._compiled[key]
        except KeyError:
            launch, address = self._compile(key, args)
        launch(address, self.count_of(*args), *args)

    def _compile(self, key, args):
        argtypes = (types.int64, types.int64) + tuple(map(typeof, args))
        self.task.compile(argtypes)
        cres = self.task.overloads[argtypes]
        address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        entry = self._compiled[key] = (_launcher(cres.signature, self.per_thread), address)
        return entry

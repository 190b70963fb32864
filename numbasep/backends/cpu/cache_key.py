"""Numba's on-disk cache of the CPU kernels, keyed on every module they compile from.

Numba keeps a cached kernel valid while its own source file is unchanged (a hash of
that one file). The kernels here inline helpers from their sibling modules (``simd``,
``halves``, ``kernels._split``, the compile flags set in ``tasks``), so an edit to a
helper left the entries compiled from the old helper valid. In an editable install with
a kept cache that ran stale machine code: a channels-last 3x3 float32 forward returned
wrong values after the helpers it inlines changed, and passed with an empty cache.

:func:`install` puts locators in front of Numba's own that serve only the files of
this directory: the same cache directories as Numba's, with a source stamp that adds a
digest of every ``.py`` file here. Any edit to any of them makes every kernel of this
backend recompile once; an installed release never changes, so its users compile once.
Numba's other functions (the user's, other libraries') keep Numba's locators.
"""

import functools
import hashlib
import os

from numba.core import caching

#: The directory whose modules the kernels compile from.
SOURCES = os.path.dirname(os.path.abspath(__file__))


def tree_digest(directory):
    """sha256 over the names and contents of the ``.py`` files directly in *directory*."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py"):
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _digest(directory, stamps):
    # keyed on the files' (mtime, size) as well, so an edit while a process runs is seen
    return tree_digest(directory)


def sources_digest(directory=SOURCES):
    """The digest of *directory*'s sources, recomputed only when a file's stat changes."""
    stamps = tuple(sorted((e.name, st.st_mtime_ns, st.st_size)
                          for e in os.scandir(directory) if e.name.endswith(".py")
                          for st in (e.stat(),)))
    return _digest(directory, stamps)


def _serves(py_file):
    return os.path.dirname(os.path.abspath(py_file)) == SOURCES


class _TreeStamp:
    """Mixin for a Numba locator: this directory's files only, stamped with its digest."""

    def get_source_stamp(self):
        return (super().get_source_stamp(), sources_digest())

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _serves(py_file):
            return None
        return super().from_function(py_func, py_file)


def _impl_class():
    # CacheImpl since Numba 0.61 (earlier _CacheImpl)
    return getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)


def instance(*key):
    """Decorator, under ``njit(cache=True)``, for a kernel that a factory builds once
    per ``key`` (a closure): ``key`` joins the function's ``__qualname__``.

    Numba names a compiled function's symbol after its qualified name, its argument
    types and a counter of the process that compiled it, not after the values it
    closes over. Two closures of one factory compiled for the same argument types by
    two processes, each at the same count, got the same symbol; a third process that
    loaded both from the cache ran one's code for the other (a CI run, 7 December
    2026: the generic row kernels' forward of a 2x2 window ran the 3x3 one's,
    returning garbage). Named apart, each closure also gets index files of its own,
    so processes compiling different closures no longer rewrite one index.
    """
    tag = "_".join(str(k) for k in key)

    def name(fn):
        fn.__qualname__ = f"{fn.__qualname__}_{tag}"
        return fn
    return name


def install():
    """Put the tree-stamped locators in front of Numba's; True if they are in place.

    Must run before the kernels' modules are imported: Numba picks a function's
    locator when its ``cache=True`` decorator runs. Idempotent. Returns False (and
    Numba keeps its own keys) where this Numba has no locator list to extend.
    """
    impl = _impl_class()
    mixin = getattr(caching, "_SourceFileBackedLocatorMixin", None)
    if impl is None or mixin is None or not isinstance(getattr(impl, "_locator_classes",
                                                               None), list):
        return False
    classes = impl._locator_classes
    if any(issubclass(c, _TreeStamp) for c in classes):
        return True
    ours = [type("Tree" + c.__name__.lstrip("_"), (_TreeStamp, c), {})
            for c in classes if issubclass(c, mixin)]
    classes[:0] = ours
    return bool(ours)

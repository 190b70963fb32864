"""asv: what a new process pays before its first result (each sample a fresh interpreter).

* ``timeraw_import``: ``import numbasep`` (NumPy already imported).
* ``timeraw_first_call_cold``: import and first forward call with an empty Numba
  cache (``NUMBA_CACHE_DIR`` pointed at a new folder): the full compilation.
* ``timeraw_first_call_warm_cache``: the same in a new process after the cache
  was filled (by ``setup``): loading compiled code instead of compiling.
"""

import os
import subprocess
import sys
import tempfile

_ARRAYS = """
import os
os.environ["NUMBA_CACHE_DIR"] = {cache}
import numpy as np
x = np.ones((1, 14, 14, 32), np.float32)
w = np.ones((3, 3, 32, 1), np.float32)
"""
_CALL = """
import numbasep
numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
"""

_WARM_CACHE = os.path.join(tempfile.gettempdir(), "numbasep-asv-warm-cache")


def timeraw_import():
    return "import numbasep", "import numpy"


def timeraw_first_call_cold():
    # A new, empty cache folder for every sample (made by the timed child's setup).
    return _CALL, "import tempfile\n" + _ARRAYS.format(
        cache='tempfile.mkdtemp(prefix="numbasep-asv-cold-")')


timeraw_first_call_cold.number = 1
timeraw_first_call_cold.repeat = (1, 3, 60.0)
timeraw_first_call_cold.timeout = 600


class WarmCache:
    timeout = 600

    def setup(self):
        code = _ARRAYS.format(cache=repr(_WARM_CACHE)) + _CALL
        subprocess.run([sys.executable, "-c", code], check=True)

    def timeraw_first_call_warm_cache(self):
        return _CALL, _ARRAYS.format(cache=repr(_WARM_CACHE))

    timeraw_first_call_warm_cache.number = 1

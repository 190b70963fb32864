"""``numbasep bench``: time the suite of :mod:`numbasep.suite`, side by side with peers.

The command line (``python -m numbasep bench``) calls :func:`configure_parser` on
its ``bench`` subparser and :func:`run` with the parsed arguments.

What is measured, per case:

* numbasep's median time per call over ``--repeats`` samples, after warm-up
  calls (the first one compiles), with the interquartile range as the spread
  (``q1``–``q3``; min and max are in the JSON too). Each sample times enough
  back-to-back calls to last at least ``--min-time`` (small calls are averaged).
  The results are written into preallocated arrays (``out=``); with ``--fresh``
  a second timing lets every call allocate its results (page faults included).
* GB/s = :func:`numbasep.suite.bytes_moved` / median, and that as a percentage
  of the machine's bandwidth, measured once at start-up with a threaded NumPy
  copy: of the L3-resident bandwidth when the case's bytes fit in L3 ("warm":
  the previous call left the data in cache) and of the DRAM bandwidth otherwise
  ("cold").
* With ``--peers``, the same cases in TensorFlow (oneDNN and Eigen), PyTorch
  (channels_last) and JAX, each in its own process restricted to the same number
  of threads (see :mod:`numbasep.peers`), and the ratio numbasep / best peer
  (below 1 means numbasep is faster). The peers' processes stay up for the whole
  run, and each case's samples are taken in rounds, numbasep and every peer in
  turn (:func:`numbasep.peers.driver.interleave`), so that the ratio compares
  times taken over the same minutes of a shared machine.
"""

import argparse
import json
import os
import sys
import time

from . import suite

#: Peer names accepted by ``--peers`` (the driver in :mod:`numbasep.peers` owns them).
PEER_NAMES = ("tf-onednn", "tf-eigen", "torch", "jax")


# ------------------------------------------------------------------ command line

def _csv(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def configure_parser(parser):
    """Add the ``bench`` options to an :mod:`argparse` (sub)parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The parser (typically the ``bench`` subparser of ``python -m numbasep``).

    Returns
    -------
    argparse.ArgumentParser
        The same parser, for chaining.

    Examples
    --------
    >>> import argparse
    >>> from numbasep import bench
    >>> p = bench.configure_parser(argparse.ArgumentParser())
    >>> a = p.parse_args(["--op", "forward", "--peers"])
    >>> a.quick, a.op, a.peers
    (True, ['forward'], 'all')
    """
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="quick", action="store_true", default=True,
                      help="the quick subset of the suite (default; well under a minute)")
    size.add_argument("--full", dest="quick", action="store_false",
                      help="the whole suite of PERFORMANCE.md (long: 390 cases)")
    parser.add_argument("--op", type=_csv, default=None, metavar="OP[,OP...]",
                        help="keep these ops: " + ", ".join(suite.OPS))
    parser.add_argument("--dtype", type=_csv, default=None, metavar="DT[,DT...]",
                        help="keep these dtypes: " + ", ".join(suite.DTYPES))
    parser.add_argument("--layout", type=_csv, default=None, metavar="L[,L...]",
                        help="NHWC, NCHW (2-D rows) or channels_last, channels_first (all ranks)")
    parser.add_argument("--batch", type=lambda v: [int(x) for x in _csv(v)], default=None,
                        metavar="N[,N...]", help="keep these batch sizes")
    parser.add_argument("--case", default=None, metavar="REGEX",
                        help="keep cases whose name matches this regular expression")
    parser.add_argument("--repeats", type=int, default=15,
                        help="timed samples per case (default 15); the median is reported")
    parser.add_argument("--min-time", type=float, default=2e-3, metavar="SECONDS",
                        help="minimum duration of one sample (default 0.002)")
    parser.add_argument("--fresh", action=argparse.BooleanOptionalAction, default=True,
                        help="also time calls that allocate their results (no out=), "
                             "page faults included (default: on; --no-fresh skips it)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for numbasep and every peer (default: Numba's "
                             "NUMBA_NUM_THREADS)")
    parser.add_argument("--threading-layer", default=None,
                        choices=("omp", "tbb", "workqueue", "default"),
                        help="Numba threading layer (default: NUMBA_THREADING_LAYER if "
                             "set, else omp when available)")
    parser.add_argument("--peers", nargs="?", const="all", default=None, metavar="P[,P...]",
                        help="also time peers, each in its own process: all (the default "
                             "when the option is given bare) or some of " + ", ".join(PEER_NAMES))
    parser.add_argument("--peers-python", default=None, metavar="PATH",
                        help="interpreter that runs the peers (default: this one), e.g. "
                             "/tmp/peers-venv/bin/python")
    parser.add_argument("--peer-timeout", type=float, default=900.0, metavar="SECONDS",
                        help="give up on a peer process that has not answered (built and "
                             "warmed up a case, or taken a round of samples) after this "
                             "long (default 900)")
    parser.add_argument("--json", default=None, metavar="FILE_OR_-",
                        help="write the results as JSON to FILE (- for stdout; the table "
                             "then goes to stderr)")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="draw a roofline chart (needs matplotlib)")
    parser.add_argument("--from-json", default=None, metavar="FILE",
                        help="do not measure: print the table (and --plot) of saved results")
    parser.add_argument("--no-bandwidth", action="store_true",
                        help="skip the bandwidth measurement (no %% of bandwidth column)")
    return parser


# ------------------------------------------------------------------ progress

class _Progress:
    """Progress on stderr: tqdm when installed, else one plain line per step."""

    def __init__(self, total, desc, enabled=True):
        self.total, self.desc, self.n = total, desc, 0
        self.enabled = enabled
        self._bar = None
        if enabled and total and sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
            except ImportError:
                pass

    def step(self, label):
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(label[:40], refresh=False)
            self._bar.update(1)
        else:
            print(f"[{self.desc} {self.n}/{self.total}] {label}", file=sys.stderr, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()


def _note(msg):
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ machine facts

def l3_bytes():
    """Size of the last-level (L3) cache in bytes, from sysfs; 32 MiB when unknown."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            d = os.path.join(base, idx)
            with open(os.path.join(d, "level")) as f:
                if f.read().strip() != "3":
                    continue
            with open(os.path.join(d, "size")) as f:
                s = f.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
            return int(s.rstrip("KMGkmg")) * mult
    except (OSError, ValueError):
        pass
    return 32 << 20


def cpu_model():
    """The CPU's model name (from /proc/cpuinfo), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _threaded_copy(dst, src, threads, pool):
    n = src.shape[0]
    step = -(-n // threads)
    futs = [pool.submit(dst.__setitem__, slice(i, i + step), src[i:i + step])
            for i in range(0, n, step)]
    for f in futs:
        f.result()


def measure_bandwidth(threads, l3=None, repeats=None):
    """Memory bandwidth of this machine, measured with a threaded NumPy copy.

    ``threads`` Python threads each copy a slice (NumPy releases the GIL while
    copying); bytes counted are read + written (2x the buffer), as STREAM's copy
    counts them (write-allocate traffic not counted, as in
    :func:`numbasep.suite.bytes_moved`). Best of several runs.

    Parameters
    ----------
    threads : int
    l3 : int, optional
        L3 size in bytes (default :func:`l3_bytes`).

    Returns
    -------
    dict
        ``dram_gbps`` (buffers of 8x L3, at least 256 MiB each), ``l3_gbps``
        (source and destination together a quarter of L3), ``l3_bytes``,
        ``method``.
    """
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    l3 = l3 or l3_bytes()
    res = {"l3_bytes": l3, "threads": threads,
           "method": f"NumPy copy in {threads} threads, best of runs, bytes = read + write"}
    with ThreadPoolExecutor(threads) as pool:
        for key, nbytes, reps in (("dram_gbps", max(8 * l3, 256 << 20), 6),
                                  ("l3_gbps", max(l3 // 8, 1 << 20), 200)):
            if repeats:
                reps = repeats
            src = np.ones(nbytes // 8, np.float64)
            dst = np.zeros_like(src)
            _threaded_copy(dst, src, threads, pool)
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                _threaded_copy(dst, src, threads, pool)
                best = min(best, time.perf_counter() - t)
            res[key] = 2 * nbytes / best / 1e9
            del src, dst
    return res


def _setup_numba(threads, layer):
    """Choose the threading layer and thread count; return the numbers actually used."""
    import numba
    if layer is None:
        layer = os.environ.get("NUMBA_THREADING_LAYER")
        if layer is None:
            try:
                import numba.np.ufunc.omppool  # noqa: F401  (loadable => omp available)
                layer = "omp"
            except Exception:
                layer = "default"
    try:
        numba.config.THREADING_LAYER = layer
    except Exception:
        pass
    maxt = numba.config.NUMBA_NUM_THREADS
    threads = maxt if threads is None else max(1, min(int(threads), maxt))
    numba.set_num_threads(threads)
    return threads


def _numba_layer():
    import numba
    try:
        return numba.threading_layer()
    except ValueError:
        return "not yet started"


# ------------------------------------------------------------------ measuring

def select_cases(args):
    """The cases the arguments ask for."""
    return suite.cases(quick=args.quick, op=args.op, dtype=args.dtype, layout=args.layout,
                       N=args.batch, name=args.case)


class _Numbasep:
    """numbasep itself as a contender of :func:`numbasep.peers.driver.interleave`,
    in this process: the results written into preallocated arrays (``out=``)."""

    name = "numbasep"

    def __init__(self):
        self._fn = self._number = None

    def prepare(self, case, min_time):
        from .peers._harness import calibrate
        try:
            _, self._fn = suite.make_inputs(case, 0, out=True)
            cal = calibrate(self._fn, min_time)
        except Exception as e:  # a failing case must not hide the others
            self._fn = None
            return {"error": f"{type(e).__name__}: {e}"[:500]}
        self._number = cal["number"]
        return cal

    def samples(self, count, warm_s=0.0):
        from .peers._harness import samples
        return samples(self._fn, self._number, count, warm_s)

    def end(self):
        self._fn = None


def time_case(case, repeats=15, min_time=2e-3, fresh=False, max_case_time=5.0, peers=()):
    """Time numbasep on one case, side by side with the running ``peers``
    (:func:`numbasep.peers.driver.interleave`; see the module docstring for the
    protocol).

    Parameters
    ----------
    case : numbasep.suite.Case
    repeats, min_time, max_case_time
        The timing protocol (:func:`numbasep.peers._harness.time_call`).
    fresh : bool
        Also time calls that allocate their results, numbasep alone, afterwards.
    peers : sequence of numbasep.peers.driver.Runner
        Peers timed in turn with numbasep.

    Returns
    -------
    dict
        Contender name (``"numbasep"`` and the peers') -> the fields of
        :func:`numbasep.peers._harness.time_call` (numbasep's with ``fresh``
        holding the same for calls that allocate their results), or a dict
        with ``error``, ``unsupported`` or (a peer that went away) ``gone``.
    """
    from .peers._harness import time_call
    from .peers.driver import interleave
    res = interleave(case, [_Numbasep(), *peers], repeats=repeats, min_time=min_time,
                     max_case_time=max_case_time)
    ours = res["numbasep"]
    if fresh and "median_s" in ours:
        try:
            _, fn = suite.make_inputs(case, 0, out=False)
            ours["fresh"] = time_call(fn, repeats=repeats, min_time=min_time,
                                      max_case_time=max_case_time)
        except Exception as e:  # say so in the row; the out= timing stands
            ours["fresh"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return res


def _row(case, res, bw):
    b = suite.bytes_moved(case)
    f = suite.flops(case)
    row = {"case": case.to_dict(), "name": case.name, "bytes": b, "flops": f,
           "intensity": f / b}
    if bw:
        warm = b <= bw["l3_bytes"]
        row["regime"] = "warm" if warm else "cold"
        row["limit_gbps"] = bw["l3_gbps"] if warm else bw["dram_gbps"]
        row["floor_s"] = b / (row["limit_gbps"] * 1e9)
    else:
        row["regime"] = None
    if res is not None and "median_s" in res:
        row["numbasep"] = res
        row["gbps"] = b / res["median_s"] / 1e9
        row["gflops"] = f / res["median_s"] / 1e9
        if bw:
            row["pct_bw"] = 100.0 * row["gbps"] / row["limit_gbps"]
    else:
        row["numbasep"] = res
    return row


def _best_peer(row):
    best = None
    for name, r in row.get("peers", {}).items():
        if r and "median_s" in r and (best is None or r["median_s"] < best[1]):
            best = (name, r["median_s"])
    if best:
        row["best_peer"] = best[0]
        if row.get("numbasep") and "median_s" in row["numbasep"]:
            row["ratio"] = row["numbasep"]["median_s"] / best[1]


# ------------------------------------------------------------------ reporting

def _ms(s):
    return f"{s * 1e3:.3f}" if s < 10 else f"{s * 1e3:.0f}"


def _fmt_timing(r, spread=True):
    if not r:
        return "-"
    if "median_s" in r:
        txt = _ms(r["median_s"])
        if spread:
            txt += f" ±{(r['q3_s'] - r['q1_s']) * 1e3:.3f}"
        return txt
    if "unsupported" in r:
        return "n/a"
    if "error" in r:
        return "error"
    return "-"


def format_table(report):
    """The results as a plain-text table (str)."""
    rows = report["rows"]
    peers = report.get("peers", {}).get("ran", [])
    fresh = any(r.get("numbasep") and "fresh" in r["numbasep"] for r in rows)
    head = ["case", "numbasep ms ±IQR"]
    if fresh:
        head.append("fresh ms")
    head += [f"{p} ms" for p in peers]
    if peers:
        head += ["best peer", "nb/best"]
    head += ["GB/s", "%bw", "data"]
    table = [head]
    for r in rows:
        nb = r.get("numbasep")
        line = [r["name"], _fmt_timing(nb) if nb else "-"]
        if nb and "error" in nb:
            line[1] = "error"
        if fresh:
            line.append(_fmt_timing(nb.get("fresh"), spread=False) if nb else "-")
        for p in peers:
            line.append(_fmt_timing(r.get("peers", {}).get(p), spread=False))
        if peers:
            line.append(r.get("best_peer", "-"))
            line.append(f"{r['ratio']:.2f}" if "ratio" in r else "-")
        line.append(f"{r['gbps']:.1f}" if "gbps" in r else "-")
        line.append(f"{r['pct_bw']:.0f}%" if "pct_bw" in r else "-")
        line.append(r.get("regime") or "-")
        table.append(line)
    widths = [max(len(str(t[i])) for t in table) for i in range(len(head))]
    out = []
    for k, t in enumerate(table):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(t, widths))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_header(report):
    """Lines describing the machine and the protocol (str)."""
    m = report["machine"]
    lines = [
        f"numbasep {m['numbasep']}  numba {m['numba']}  numpy {m['numpy']}  "
        f"python {m['python']}",
        f"CPU: {m['cpu']}  ({m['cpu_count']} CPUs visible)",
        f"Numba threading layer: {m['threading_layer']}, threads: {m['threads']}",
    ]
    bw = report.get("bandwidth")
    if bw:
        lines.append(
            f"Bandwidth ({bw['method']}): DRAM {bw['dram_gbps']:.1f} GB/s, "
            f"L3-resident {bw['l3_gbps']:.1f} GB/s; L3 = {bw['l3_bytes'] / 2**20:.0f} MiB "
            f"(a case whose bytes fit in L3 is 'warm' and compared with the L3 figure, "
            f"else 'cold' and compared with DRAM)")
    p = report["protocol"]
    lines.append(
        f"Times: median of {p['repeats']} samples after warm-up (each sample >= "
        f"{p['min_time'] * 1e3:g} ms of back-to-back calls), ± = interquartile range "
        f"(q3 - q1); results written with out= (preallocated)"
        + ("; 'fresh' = results allocated per call" if p.get("fresh") else ""))
    peers = report.get("peers")
    if peers:
        for name, info in peers.get("info", {}).items():
            if info.get("status") == "ran":
                lines.append(f"peer {name}: {info.get('version', '?')} "
                             f"({info.get('threads', '?')} threads, own process)"
                             + (f"; STOPPED - {info['error']}" if info.get("partial") else ""))
            else:
                lines.append(f"peer {name}: NOT RUN - {info.get('error', info.get('status'))}")
        if peers.get("ran"):
            lines.append("Side by side: each case's samples taken in rounds, numbasep and the "
                         "peers in turn (a rotated order)")
            lines.append("nb/best = numbasep median / best peer median (< 1: numbasep faster)")
    return "\n".join(lines)


def plot_roofline(report, path):
    """Draw a roofline chart of ``report`` into ``path``.

    Left: achieved GFLOP/s against arithmetic intensity (FLOP/byte), under the
    DRAM and L3 bandwidth roofs. Right: achieved GB/s against intensity, with the
    two bandwidths as horizontal limits. numbasep and every measured peer are
    drawn with their own markers.

    Parameters
    ----------
    report : dict
        As :func:`run` builds it (or read back from ``--json``).
    path : str
        Output image file.

    Returns
    -------
    bool
        False (with a message on stderr) when matplotlib is not installed.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _note("--plot needs matplotlib, which is not installed "
              "(pip install matplotlib); no chart written")
        return False
    rows = report["rows"]
    contenders = ["numbasep"] + list(report.get("peers", {}).get("ran", []))
    markers = "os^vDP*X"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    ai_all = [r["intensity"] for r in rows] or [1.0]
    lo, hi = min(ai_all) / 2, max(ai_all) * 2
    bw = report.get("bandwidth")
    if bw:
        for key, style, label in (("dram_gbps", "-", "DRAM"), ("l3_gbps", "--", "L3")):
            g = bw[key]
            ax1.plot([lo, hi], [lo * g, hi * g], "k" + style, lw=1,
                     label=f"{label} roof {g:.0f} GB/s")
            ax2.axhline(g, color="k", ls=style, lw=1, label=f"{label} {g:.0f} GB/s")
    for i, who in enumerate(contenders):
        xs, gf, gb = [], [], []
        for r in rows:
            t = r.get("numbasep") if who == "numbasep" else r.get("peers", {}).get(who)
            if t and "median_s" in t:
                xs.append(r["intensity"])
                gf.append(r["flops"] / t["median_s"] / 1e9)
                gb.append(r["bytes"] / t["median_s"] / 1e9)
        if xs:
            kw = dict(marker=markers[i % len(markers)], ls="none", label=who,
                      alpha=0.9 if who == "numbasep" else 0.6,
                      ms=7 if who == "numbasep" else 5)
            ax1.plot(xs, gf, **kw)
            ax2.plot(xs, gb, **kw)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte of the minimum traffic)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("achieved GFLOP/s")
    ax2.set_ylabel("achieved GB/s")
    ax1.set_title("roofline")
    ax2.set_title("bandwidth achieved")
    ax2.legend(fontsize=8, loc="best")
    m = report["machine"]
    fig.suptitle(f"numbasep bench: {m['cpu']}, {m['threads']} threads "
                 f"({m['threading_layer']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------ entry point

def _machine(threads):
    import numba
    import numpy
    import platform
    from . import __version__
    return {"numbasep": __version__, "numba": numba.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "cpu": cpu_model(),
            "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "threads": threads, "threading_layer": None}


def measure(cases, args, progress=True):
    """Measure ``cases`` as ``args`` say; return the report (a JSON-ready dict).

    Numba's thread count is restored afterwards (the command may run inside a
    longer-lived process, such as a test session).
    """
    import numba
    saved = numba.get_num_threads()
    try:
        return _measure(cases, args, progress)
    finally:
        numba.set_num_threads(saved)


def _measure(cases, args, progress):
    threads = _setup_numba(args.threads, getattr(args, "threading_layer", None))
    report = {"machine": _machine(threads),
              "protocol": {"repeats": args.repeats, "min_time": args.min_time,
                           "fresh": bool(args.fresh), "quick": bool(args.quick),
                           "spread": "interquartile range q1..q3 of per-call times",
                           "out": "results written into preallocated arrays (out=)"},
              "rows": []}
    if not getattr(args, "no_bandwidth", False):
        _note(f"measuring memory bandwidth ({threads} threads)...")
        report["bandwidth"] = measure_bandwidth(threads)
    bw = report.get("bandwidth")
    runners = {}
    if args.peers:
        from .peers import driver
        names = list(PEER_NAMES) if args.peers == "all" else _csv(args.peers)
        runners = driver.start_peers(names, python=args.peers_python, threads=threads,
                                     timeout=args.peer_timeout, progress=progress)
        report["peers"] = {"ran": [n for n, r in runners.items() if r.alive]}
    bar = _Progress(len(cases), "numbasep" + (" and peers" if runners else ""), progress)
    try:
        for case in cases:
            res = time_case(case, repeats=args.repeats, min_time=args.min_time,
                            fresh=args.fresh, peers=[r for r in runners.values() if r.alive])
            row = _row(case, res.pop("numbasep"), bw)
            if runners:
                for name, r in res.items():
                    if "gone" in r:
                        runners[name].fail(f"{r['gone']} (at {case.name})")
                        res[name] = None
                row["peers"] = {n: res.get(n) for n in report["peers"]["ran"]}
                _best_peer(row)
            report["rows"].append(row)
            bar.step(case.name)
            if report["machine"]["threading_layer"] in (None, "not yet started"):
                report["machine"]["threading_layer"] = _numba_layer()
    finally:
        for r in runners.values():
            r.close()
        bar.close()
    if runners:
        report["peers"]["info"] = {n: r.info for n, r in runners.items()}
    return report


def run(args):
    """Run the ``bench`` command.

    Parameters
    ----------
    args : argparse.Namespace
        As parsed by a parser set up with :func:`configure_parser`.

    Returns
    -------
    int
        Exit code: 0 on success, 1 when a numbasep case failed, 2 for bad
        arguments (no case selected, unknown peer, unreadable input).
    """
    if args.from_json:
        try:
            with open(args.from_json) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            _note(f"cannot read {args.from_json}: {e}")
            return 2
    else:
        if args.peers and args.peers != "all":
            bad = [p for p in _csv(args.peers) if p not in PEER_NAMES]
            if bad:
                _note(f"unknown peer(s) {bad}; choose from {', '.join(PEER_NAMES)}")
                return 2
        if args.repeats < 1:
            _note("--repeats must be >= 1")
            return 2
        cases = select_cases(args)
        if not cases:
            _note("no case matches the filters (see numbasep.suite.cases)")
            return 2
        report = measure(cases, args)
    to_stdout = args.json == "-"
    stream = sys.stderr if to_stdout else sys.stdout
    print(format_header(report), file=stream)
    print(file=stream)
    print(format_table(report), file=stream, flush=True)
    if args.json:
        text = json.dumps(report, indent=1, default=str)
        if to_stdout:
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.plot:
        plot_roofline(report, args.plot)
    failed = [r["name"] for r in report["rows"]
              if not r.get("numbasep") or "error" in r["numbasep"]]
    if failed:
        _note(f"{len(failed)} case(s) failed: " + ", ".join(failed[:10]))
        for r in report["rows"]:
            if r["name"] in failed[:3]:
                _note(f"  {r['name']}: {r['numbasep'].get('error') if r['numbasep'] else '?'}")
        return 1
    return 0


def main(argv=None):
    """Stand-alone entry point: ``python -m numbasep.bench [options]``."""
    p = configure_parser(argparse.ArgumentParser(
        prog="numbasep bench", description=__doc__.split("\n")[0]))
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

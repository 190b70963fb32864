"""The benchmark machinery: numbasep.suite, numbasep.bench and the peer driver.

Everything runs on tiny shapes (no timing is judged): the suite is well-formed,
the byte and FLOP formulas match hand computations, the callables of
``make_inputs`` compute what the reference says, ``bench.run`` writes the JSON
it promises, and peers that are not installed are reported cleanly.
"""

import argparse
import json
import os
import stat
import sys

import numpy as np
import pytest

from numbasep import bench, shapes, suite
from numbasep.peers import _harness, driver

import reference as R


# ------------------------------------------------------------------ the suite

def test_cases_are_unique_and_valid():
    cases = suite.all_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    for c in cases:
        assert c.op in suite.OPS and c.dtype in suite.DTYPES
        assert (c.filters is not None) == c.op.startswith("separable")
        if c.ndim == 2 and not c.op.startswith("separable"):
            s = c.stride
            st = [1, s, s, 1] if c.layout == "NHWC" else [1, 1, s, s]
            plan = shapes.raw_forward(c.input_shape, c.filter_shape, st, "SAME",
                                      data_format=c.layout)
        else:
            plan = shapes.keras(c.input_shape, c.filter_shape, c.stride, "same",
                                c.data_format,
                                pointwise_shape=c.pointwise_shape if c.filters else None)
        assert plan.output_shape == c.output_shape, c.name
        assert plan.input_shape == c.input_shape
        assert plan.filter_shape == c.filter_shape
        if c.filters:
            assert plan.separable_output_shape == c.separable_output_shape
        assert tuple(p[0] for p in c.pads) == plan.pads[3 - c.ndim:]
        assert suite.bytes_moved(c) > 0 and suite.flops(c) > 0


def test_suite_covers_performance_md():
    cases = suite.all_cases()
    assert {c.N for c in cases if c.ndim == 2} == {1, 8, 32}
    assert {c.multiplier for c in cases} == {1, 2, 4}
    assert {c.ndim for c in cases} == {1, 2, 3}
    assert {c.layout for c in cases} == {"NHWC", "NCHW", "channels_last", "channels_first"}
    assert {"float16", "bfloat16"} <= {c.dtype for c in cases}
    assert {c.op for c in cases} == set(suite.OPS)
    # every 2-D shape of the table, at every batch size, in both layouts, for all 3 ops
    assert len(suite.cases(op="forward", N=32, layout="NCHW", dtype="float32")) == \
        len(suite.SHAPES_2D)


def test_quick_subset_and_filters():
    quick = suite.cases(quick=True)
    assert 5 <= len(quick) <= 30
    assert {c.op for c in quick} == set(suite.OPS)
    assert all(c in suite.all_cases() for c in quick)
    # bytes a quick call moves stay small (each call a few ms at most)
    assert max(suite.bytes_moved(c) for c in quick) < 64e6
    fwd = suite.cases(quick=True, op="forward", layout="channels_last", dtype="float32")
    assert fwd and all(c.op == "forward" and c.channels_last for c in fwd)
    assert suite.cases(layout="NCHW") and all(c.layout == "NCHW"
                                              for c in suite.cases(layout="NCHW"))
    assert all(c.N == 8 for c in suite.cases(N=8))
    assert [c.name for c in suite.cases(name=r"^bwd_filter/56x56x144/k3s1/N32$")] == \
        ["bwd_filter/56x56x144/k3s1/N32"]


def test_bytes_and_flops_by_hand():
    c = suite.find("forward/56x56x144/k3s1/N8")
    x = 8 * 56 * 56 * 144
    assert suite.bytes_moved(c) == 4 * (x + x + 3 * 3 * 144) == 28_906_560
    assert suite.flops(c) == 2 * 8 * 56 * 56 * 144 * 9 == 65_028_096
    assert suite.intensity(c) == pytest.approx(2.25, rel=1e-3)

    c = suite.find("bwd_input/112x112x96/k3s2/N8")          # strided: output 56x56
    assert c.out_spatial == (56, 56) and c.pads == ((0, 1), (0, 1))
    assert suite.bytes_moved(c) == 4 * (8 * 112 * 112 * 96 + 8 * 56 * 56 * 96 + 9 * 96)
    assert suite.flops(c) == 2 * 8 * 56 * 56 * 96 * 9

    c = suite.find("forward/56x56x144/k3s1/N8/bf16")
    assert suite.bytes_moved(c) == 2 * (2 * x + 9 * 144)

    c = suite.find("forward/19x19x728/k3s1/m2/N8")
    assert suite.bytes_moved(c) == 4 * (8 * 361 * 728 + 8 * 361 * 1456 + 9 * 1456)

    c = suite.find("sep_forward/56x56x144/k3s1/F24/N8")
    p = 8 * 56 * 56
    assert suite.bytes_moved(c) == 4 * (p * 144 + 9 * 144 + 144 * 24 + p * 24) == 16_878_144
    assert suite.flops(c) == 2 * p * 144 * 9 + 2 * p * 144 * 24 == 238_436_352

    c = suite.find("sep_grad/19x19x728/k3s1/F728/N8")
    p = 8 * 19 * 19
    assert suite.bytes_moved(c) == 4 * (2 * p * 728 + p * 728 + 2 * 9 * 728 + 2 * 728 * 728)
    assert suite.flops(c) == 3 * 2 * p * 728 * 9 + 2 * 2 * p * 728 * 728


_TINY = [
    ((7, 6), 5, 3, 1, 1, "NHWC"),
    ((9, 8), 4, 3, 2, 2, "NCHW"),
    ((11,), 4, 5, 2, 1, "channels_last"),
    ((11,), 3, 3, 1, 2, "channels_first"),
    ((4, 5, 6), 3, 3, 2, 1, "channels_last"),
    ((4, 5, 6), 2, 3, 1, 2, "channels_first"),
]


def _ref(case, arrays):
    cf = not case.channels_last
    x = R.to_last(arrays["x"].astype(np.float64), cf)
    w = arrays["w"].astype(np.float64)
    st = (case.stride,) * case.ndim
    dl = (1,) * case.ndim
    pads = tuple(p[0] for p in case.pads)
    if case.op == "forward":
        return R.to_first(R.forward(x, w, st, dl, pads, case.out_spatial), cf)
    dy = R.to_last(arrays["dy"].astype(np.float64), cf)
    if case.op == "backprop_input":
        return R.to_first(R.backprop_input(x.shape, w, dy, st, dl, pads), cf)
    return R.backprop_filter(x, dy, case.kernel, st, dl, pads)


@pytest.mark.parametrize("op", suite.DEPTHWISE_OPS)
@pytest.mark.parametrize("spatial,C,k,s,M,layout", _TINY)
def test_make_inputs_computes_the_op(op, spatial, C, k, s, M, layout):
    case = suite.make_case(op, 2, spatial, C, k, s, multiplier=M, layout=layout)
    arrays, fn = suite.make_inputs(case, 1)
    got = fn()
    assert got is arrays["out"]           # written through out=
    np.testing.assert_allclose(got, _ref(case, arrays), rtol=1e-4, atol=1e-4)
    _, fresh = suite.make_inputs(case, 1, out=False)
    np.testing.assert_allclose(fresh(), got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["separable_forward", "separable_grad"])
def test_make_inputs_separable(op):
    case = suite.make_case(op, 2, 6, 4, 3, 1, filters=5)
    arrays, fn = suite.make_inputs(case, 0)
    got = fn()
    if op == "separable_forward":
        assert got is arrays["out"] and got.shape == case.separable_output_shape
        z = R.forward(arrays["x"], arrays["w"], (1, 1), (1, 1), (1, 1), case.out_spatial)
        np.testing.assert_allclose(got, R.pointwise(z, arrays["pk"]), rtol=1e-4, atol=1e-4)
    else:
        assert [g.shape for g in got] == [case.input_shape, case.filter_shape,
                                          case.pointwise_shape]
        assert got[0] is arrays["out0"]


def test_make_inputs_16bit():
    import ml_dtypes
    case = suite.make_case("forward", 1, 6, 4, 3, dtype="bfloat16")
    arrays, fn = suite.make_inputs(case, 0)
    assert arrays["x"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert fn().dtype == np.dtype(ml_dtypes.bfloat16)


def test_case_to_dict_is_json():
    c = suite.find("sep_grad/19x19x728/k3s1/F728/N8")
    d = json.loads(json.dumps(c.to_dict()))
    assert d["pointwise_shape"] == [1, 1, 728, 728]
    assert d["separable_output_shape"] == [8, 19, 19, 728]


# ------------------------------------------------------------------ bench.run

_TINY_CASES = [suite.make_case("forward", 1, 8, 4, 3),
               suite.make_case("backprop_filter", 2, 9, 4, 3, 2, layout="NCHW")]
_FAKE_BW = {"l3_bytes": 32 << 20, "l3_gbps": 100.0, "dram_gbps": 20.0, "threads": 1,
            "method": "fake"}


def _args(argv):
    return bench.configure_parser(argparse.ArgumentParser()).parse_args(argv)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(bench, "select_cases", lambda args: list(_TINY_CASES))
    monkeypatch.setattr(bench, "measure_bandwidth", lambda threads, **kw: dict(_FAKE_BW))


def test_parser_defaults():
    a = _args([])
    assert a.quick and a.peers is None and a.json is None and a.plot is None
    a = _args(["--full", "--op", "forward,backprop_filter", "--dtype", "bfloat16",
               "--layout", "NCHW", "--repeats", "3", "--peers", "torch,jax",
               "--threads", "1", "--json", "-"])
    assert not a.quick and a.op == ["forward", "backprop_filter"] and a.layout == ["NCHW"]
    assert a.peers == "torch,jax" and a.threads == 1 and a.json == "-"


def test_run_writes_json(tiny, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = bench.run(_args(["--repeats", "3", "--min-time", "0", "--fresh", "--threads", "1",
                          "--json", str(out)]))
    assert rc == 0
    table = capsys.readouterr().out
    assert "threading layer" in table and _TINY_CASES[1].name in table
    rep = json.loads(out.read_text())
    assert rep["machine"]["threads"] == 1 and rep["machine"]["threading_layer"]
    assert rep["bandwidth"]["dram_gbps"] == 20.0
    assert [r["name"] for r in rep["rows"]] == [c.name for c in _TINY_CASES]
    for r, c in zip(rep["rows"], _TINY_CASES):
        assert r["bytes"] == suite.bytes_moved(c) and r["flops"] == suite.flops(c)
        t = r["numbasep"]
        assert t["repeats"] == 3
        assert t["q1_s"] <= t["median_s"] <= t["q3_s"]
        assert t["min_s"] <= t["q1_s"] and t["q3_s"] <= t["max_s"]
        assert t["fresh"]["median_s"] > 0
        assert r["regime"] == "warm" and r["limit_gbps"] == 100.0
        assert r["gbps"] == pytest.approx(r["bytes"] / t["median_s"] / 1e9)
        assert r["pct_bw"] == pytest.approx(r["gbps"])     # of 100 GB/s
        assert r["case"]["input_shape"] == list(c.input_shape)


def test_run_json_to_stdout_and_from_json(tiny, tmp_path, capsys):
    rc = bench.run(_args(["--repeats", "3", "--min-time", "0", "--json", "-"]))
    assert rc == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)                       # stdout holds the JSON only
    assert "numbasep ms" in cap.err                 # the table went to stderr
    saved = tmp_path / "s.json"
    saved.write_text(json.dumps(rep))
    assert bench.run(_args(["--from-json", str(saved)])) == 0
    assert _TINY_CASES[0].name in capsys.readouterr().out


def test_run_rejects_bad_arguments(capsys):
    assert bench.run(_args(["--case", "no such case"])) == 2
    assert bench.run(_args(["--peers", "caffe"])) == 2


def test_plot_without_matplotlib_says_so(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import fails
    png = tmp_path / "r.png"
    rc = bench.run(_args(["--repeats", "3", "--min-time", "0", "--plot", str(png)]))
    assert rc == 0 and not png.exists()
    assert "matplotlib" in capsys.readouterr().err


# ------------------------------------------------------------------ peers

@pytest.fixture
def bare_python(tmp_path):
    """An interpreter that sees no site-packages: no TensorFlow, PyTorch or JAX."""
    path = tmp_path / "bare-python"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_driver_reports_missing_peers(bare_python):
    runners = driver.start_peers(list(driver.PEERS), python=bare_python, threads=1,
                                 progress=False)
    for name, r in runners.items():
        assert not r.alive
        assert r.info["status"] == "missing", r.info
        assert "No module named" in r.info["error"]
        r.close()


def test_driver_reports_a_missing_interpreter(tmp_path):
    r = driver.Runner("torch", python=str(tmp_path / "nope"))
    assert not r.alive
    assert r.info["status"] == "failed" and "cannot start" in r.info["error"]


def test_bench_with_missing_peers(tiny, bare_python, capsys, tmp_path):
    out = tmp_path / "p.json"
    rc = bench.run(_args(["--repeats", "3", "--min-time", "0", "--peers", "torch,jax",
                          "--peers-python", bare_python, "--json", str(out)]))
    assert rc == 0
    text = capsys.readouterr().out
    assert "peer torch: NOT RUN" in text and "peer jax: NOT RUN" in text
    rep = json.loads(out.read_text())
    assert rep["peers"]["ran"] == []
    assert rep["peers"]["info"]["jax"]["status"] == "missing"


_FAKE_RUNNER = """
import os, sys, time
sys.path.insert(0, {here!r})
import _harness
def load(threads):
    return 'fake 1.0', None
calls = 0
def build(mod, case, rng):
    if case['op'] != 'forward':
        raise NotImplementedError('forward only')
    def fn():
        global calls
        calls += 1
        if calls > int(os.environ.get('FAKE_DIE_AFTER', '1000000')):
            os._exit(9)                     # the process dies in the middle of a case
        time.sleep(float(os.environ.get('FAKE_SLEEP', '0')))
    return fn
sys.exit(_harness.main('fake', load, build))
"""


@pytest.fixture
def fake_peer(tmp_path, monkeypatch):
    """A peer 'fake' whose runner is built on _harness.main: forward cases only,
    each call sleeping FAKE_SLEEP seconds, the process dying after FAKE_DIE_AFTER
    calls."""
    script = tmp_path / "fake_runner.py"
    script.write_text(_FAKE_RUNNER.format(here=os.path.dirname(_harness.__file__)))
    monkeypatch.setitem(driver.PEERS, "fake", (str(script), {}, "a fake peer"))
    monkeypatch.setattr(bench, "PEER_NAMES", bench.PEER_NAMES + ("fake",))
    return monkeypatch


def test_runner_speaks_the_protocol(fake_peer):
    fake_peer.setenv("FAKE_SLEEP", "0.001")
    r = driver.Runner("fake", threads=1)
    try:
        assert r.alive and r.info["version"] == "fake 1.0"
        cal = r.prepare(_TINY_CASES[0], min_time=0.005)
        assert cal["number"] >= 2 and cal["single_s"] >= 0.001
        times = r.samples(4, warm_s=0.01)
        assert len(times) == 4 and min(times) >= 0.001
        r.end()
        assert r.prepare(_TINY_CASES[1]) == {"unsupported": "forward only"}
    finally:
        r.close()
    assert not r.alive


class _Clock:
    """A contender whose samples record the order they were taken in."""

    def __init__(self, name, log, per_call=1e-3, unsupported=False):
        self.name, self.log, self.per_call, self.unsupported = name, log, per_call, unsupported
        self.ended = False

    def prepare(self, case, min_time):
        if self.unsupported:
            return {"unsupported": "no"}
        return {"first_call_s": 0.5, "single_s": self.per_call, "number": 1}

    def samples(self, count, warm_s):
        self.log.append((self.name, count, warm_s))
        return [self.per_call] * count

    def end(self):
        self.ended = True


def test_interleave_takes_turns_in_rotated_rounds():
    log = []
    a, b, c = _Clock("a", log), _Clock("b", log, 2e-3), _Clock("c", log, unsupported=True)
    res = driver.interleave(_TINY_CASES[0], [a, b, c], repeats=7, rounds=3, warm_s=0.25)
    assert [n for n, _, _ in log] == ["a", "b", "b", "a", "a", "b"]
    assert [k for n, k, _ in log if n == "a"] == [3, 2, 2]
    assert {w for _, _, w in log} == {0.25}
    assert res["a"]["median_s"] == 1e-3 and res["b"]["median_s"] == 2e-3
    assert res["a"]["repeats"] == 7 and res["a"]["first_call_s"] == 0.5
    assert res["c"] == {"unsupported": "no"}
    assert a.ended and b.ended and not c.ended


def test_interleave_keeps_a_slow_case_within_its_budget():
    log = []
    slow = _Clock("slow", log, per_call=1.0)
    res = driver.interleave(_TINY_CASES[0], [slow], repeats=15, max_case_time=2.0)
    assert res["slow"]["repeats"] == 3 and sum(k for _, k, _ in log) == 3


def test_bench_interleaves_with_a_peer(tiny, fake_peer, tmp_path):
    fake_peer.setenv("FAKE_SLEEP", "0.002")
    out = tmp_path / "r.json"
    assert bench.run(_args(["--repeats", "3", "--min-time", "0", "--no-fresh",
                            "--peers", "fake", "--json", str(out)])) == 0
    rep = json.loads(out.read_text())
    assert rep["peers"]["ran"] == ["fake"] and not rep["peers"]["info"]["fake"].get("partial")
    fwd, other = rep["rows"][0], rep["rows"][1]
    assert fwd["peers"]["fake"]["median_s"] >= 0.002 and fwd["best_peer"] == "fake"
    assert fwd["ratio"] == fwd["numbasep"]["median_s"] / fwd["peers"]["fake"]["median_s"]
    assert other["peers"]["fake"] == {"unsupported": "forward only"}


def test_bench_survives_a_peer_that_dies(tiny, fake_peer, tmp_path, capsys):
    fake_peer.setenv("FAKE_DIE_AFTER", "4")       # in the first case's samples
    out = tmp_path / "r.json"
    assert bench.run(_args(["--repeats", "3", "--min-time", "0", "--no-fresh",
                            "--peers", "fake", "--json", str(out)])) == 0
    rep = json.loads(out.read_text())
    info = rep["peers"]["info"]["fake"]
    assert info["partial"] and "exited with code 9" in info["error"]
    assert all(r["peers"]["fake"] is None for r in rep["rows"])
    assert all("median_s" in r["numbasep"] for r in rep["rows"])
    assert "peer fake" in capsys.readouterr().out


def test_time_call_statistics():
    calls = []
    res = _harness.time_call(lambda: calls.append(1), repeats=5, min_time=0, warmup=2)
    assert res["repeats"] == 5 and res["number"] >= 1
    assert len(calls) == 3 + 5 * res["number"]
    assert res["min_s"] <= res["q1_s"] <= res["median_s"] <= res["q3_s"] <= res["max_s"]

"""`abicache demo`: build a C++ library and a CPython module, load them, show
what was stored and why, then show the second call hitting."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .. import cc
from ..core.cache import Artifact, Cache
from . import render

LIBRARY = r"""
#include <cstdint>
extern "C" int64_t dot(const int64_t* a, const int64_t* b, int64_t n) {
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}
"""

MODULE = r"""
#include <Python.h>
static PyObject* triple(PyObject* self, PyObject* arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(3 * v);
}
static PyMethodDef methods[] = {{"triple", triple, METH_O, "3 * x"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "abicache_demo", NULL, -1, methods};
PyMODINIT_FUNC PyInit_abicache_demo(void) { return PyModule_Create(&def); }
"""


def _timed(fn: Any) -> tuple[Artifact, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    import ctypes

    cache = Cache(args.root) if args.root else Cache()
    steps = [
        ("C++ library", lambda c: cc.build_library("abicache_dot", [LIBRARY], cache=c)),
        ("CPython module (abi3 >= 3.10)",
         lambda c: cc.build_module("abicache_demo", [MODULE], abi3="3.10", cache=c)),
    ]
    report = []
    for label, make in steps:
        first, t1 = _timed(lambda: make(cache))
        fresh = Cache(cache.root)  # as a new process starts: no in-memory memo
        second, t2 = _timed(lambda: make(fresh))
        report.append((label, first, t1, second, t2))
    lib = ctypes.CDLL(str(report[0][1].file()))
    arr = ctypes.c_int64 * 3
    lib.dot.restype = ctypes.c_int64
    dot = lib.dot(arr(1, 2, 3), arr(4, 5, 6), 3)
    mod = cc.import_extension("abicache_demo", report[1][1].file())
    tripled = mod.triple(14)
    if args.json:
        render.emit_json({
            "root": str(cache.root),
            "results": {"dot([1,2,3],[4,5,6])": dot, "triple(14)": tripled},
            "artifacts": [
                {"what": label, "key": a.key, "variant": a.variant, "path": str(a.file()),
                 "requirements": a.requirements.to_list(), "first_hit": a.hit,
                 "first_seconds": t1, "second_hit": b.hit, "second_seconds": t2}
                for label, a, t1, b, t2 in report
            ],
        })
        return 0
    render.say(f"[bold]abicache demo[/] (store: {cache.root})")
    hits = sum(a.hit for _, a, _, _, _ in report)
    title = ("found in the cache and loaded (built by an earlier run)" if hits == len(report) else
             "built, cached and loaded" if not hits else "built or found, cached and loaded")
    render.table(title, ["artifact", "key", "requirements", "file"],
                 [(label, a.key[:16], str(a.requirements) or "(none)", a.files[0])
                  for label, a, _, _, _ in report])
    for label, a, _, _, _ in report:
        render.say(f"{label} lives at {a.file()}")
    render.table("the same calls again, as a new process would make them",
                 ["artifact", "first call", "second call"],
                 [(label, f"{'hit' if a.hit else 'built'} in {t1 * 1e3:.1f} ms",
                   f"{'hit' if b.hit else 'built'} in {t2 * 1e3:.2f} ms")
                  for label, a, t1, b, t2 in report])
    render.say(f"dot([1,2,3], [4,5,6]) = {dot}   (from the C++ library)")
    render.say(f"triple(14) = {tripled}   (from the CPython module)")
    render.say("Run it again: both first calls are hits now. 'abicache ls' lists the entries."
               if hits < len(report) else "'abicache ls' lists the entries; 'abicache explain abicache_dot' says why "
                                          "they hit.")
    return 0


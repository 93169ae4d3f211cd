"""Lazy-loading stub libraries for libcudart, libnvrtc and the driver.

A stub exports the chosen API functions (names after macro expansion, as
callers compiled against the headers reference them) and, on first call of
each, loads whichever CUDA major is present and resolves that one symbol:

- library search: $ABICACHE_STUB_<LIB> (a file), then the sonames of the API
  major and of every other major whose headers were compared, newest first;
- each function is resolved independently; a missing library returns
  ABICACHE_STUB_NO_LIBRARY (9901), a missing symbol ABICACHE_STUB_NO_SYMBOL
  (9902), a call on a major whose signature differs ABICACHE_STUB_SIGNATURE
  (9903) — never abort(), never dlclose();
- every attempt and its dlerror() is kept: abicache_stub_<lib>_report(buf, n)
  returns it, and ABICACHE_STUB_DEBUG=1 prints it as it happens;
- exports live in the stub's own version node, so libraries that need
  `cudaMalloc@libcudart.so.12` never bind to the stub, and -Bsymbolic keeps
  the stub's own references inside;
- driver functions are resolved through cuGetProcAddress(_v2) with the
  header's CUDA_VERSION, so `cuMemAlloc_v2` maps to the right entry point.

Signatures that differ between the majors whose headers are available are
refused at generation with both declarations named, unless guard=True: then
the stub calls the function only on the majors that share the API major's
signature.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple, Sequence

from ..errors import AbicacheError, BuildError
from . import headers
from .loader import SONAMES

NO_LIBRARY, NO_SYMBOL, SIGNATURE = 9901, 9902, 9903
_ERROR_TYPES = {"cudaError_t", "enum cudaError", "CUresult", "enum cudaError_enum", "nvrtcResult"}
_SUFFIX = re.compile(r"^(\w+?)(_v\d+)?(_ptsz|_ptds)?$")


class StubFunction(NamedTuple):
    name: str  # exported name
    prototype: headers.Prototype
    majors: tuple[int, ...]  # majors on which it may be called


class StubPlan(NamedTuple):
    library: str
    api_major: int
    include: Path
    majors: tuple[int, ...]  # sonames tried at run time, in order
    functions: tuple[StubFunction, ...]
    notes: tuple[str, ...]  # what the comparison found


def plan(library: str, functions: Sequence[str], *, api_major: int | None = None, guard: bool = False,
         header_dirs: dict[int, Path] | None = None, majors: Sequence[int] | None = None) -> StubPlan:
    """Resolve names, compare signatures across the available majors, decide.

    majors: the CUDA majors the stub may load (default: every major whose headers
    were found); signatures are compared only among them.
    """
    if library not in headers.HEADERS:
        raise AbicacheError(f"unknown library {library!r}; use one of {', '.join(headers.HEADERS)}")
    sets = headers.discover(library, header_dirs)
    if not sets:
        raise AbicacheError(f"no {headers.HEADERS[library]} found; install the CUDA headers "
                            "(the toolkit, or pip wheels) or set ABICACHE_CUDA_HEADERS")
    if majors is not None:  # before choosing the API major: with none of them there is no choice to make
        missing = [m for m in majors if m not in sets]
        if missing:
            raise AbicacheError(f"no {library} headers for CUDA {missing} (found {sorted(sets)}): signatures "
                                "cannot be checked; install them or set ABICACHE_CUDA_HEADERS")
    api_major = api_major or max(m for m in sets if majors is None or m in majors)
    if api_major not in sets:
        raise AbicacheError(f"no CUDA {api_major} headers for {library}; found majors {sorted(sets)}")
    if majors is not None:
        sets = {m: s for m, s in sets.items() if m in majors or m == api_major}
    protos = {m: headers.prototypes(s) for m, s in sets.items()}
    chosen, problems, notes = [], [], []
    for requested in functions:
        name = _exported(requested, protos[api_major], library)
        api = protos[api_major][name]
        ok, differing = [api_major], []
        for major in sorted(protos, reverse=True):
            other = protos[major].get(name)
            if major == api_major or other is None:
                continue
            (ok if other.fingerprint == api.fingerprint else differing).append(major)
        if differing:
            detail = "; ".join(f"CUDA {m}: {protos[m][name].declaration}" for m in differing)
            notes.append(f"{name}: CUDA {api_major}: {api.declaration}; differs in {detail}")
            if not guard:
                problems.append(f"{name} differs between majors: CUDA {api_major}: {api.declaration}; {detail}")
        chosen.append(StubFunction(name, api, tuple(ok)))
    if problems:
        raise AbicacheError("signatures differ between CUDA majors, so one stub cannot call them safely:\n  "
                            + "\n  ".join(problems)
                            + "\nGenerate with guard=True (abicache stub --guard) to call them only on "
                              f"majors with the CUDA {api_major} signature, or leave them out.")
    majors = tuple([api_major] + sorted((m for m in sets if m != api_major and m in SONAMES[library]),
                                        reverse=True)) if library != "cuda" else (0,)
    return StubPlan(library, api_major, sets[api_major].include, majors, tuple(chosen), tuple(notes))


def _exported(requested: str, protos: dict[str, headers.Prototype], library: str) -> str:
    for candidate in (requested, f"{requested}_v2", f"{requested}_v3"):
        if candidate in protos:
            return candidate
    close = [n for n in protos if n.lower().startswith(requested.lower()[:8])][:6]
    raise AbicacheError(f"{requested} is not declared in the {library} headers"
                        + (f"; similar: {', '.join(close)}" if close else ""))


# ---- C generation --------------------------------------------------------------


def generate(stub: StubPlan, soname: str) -> tuple[str, str]:
    """(C source, linker version script)."""
    lib = stub.library
    candidates = [SONAMES[lib][m] for m in stub.majors] if lib != "cuda" else ["libcuda.so.1"]
    majors = list(stub.majors)
    parts = [_PRELUDE.format(lib=lib, upper=lib.upper(), header=headers.HEADERS[lib], api=stub.api_major,
                             n=len(candidates), sonames=", ".join(f'"{s}"' for s in candidates),
                             majors=", ".join(map(str, majors)), no_lib=NO_LIBRARY, no_sym=NO_SYMBOL,
                             sig=SIGNATURE)]
    if lib == "cuda":
        parts.append(_DRIVER_RESOLVE)
    parts += [_function(f, lib) for f in stub.functions]
    exports = [f.name for f in stub.functions] + [f"abicache_stub_{lib}_report", f"abicache_stub_{lib}_major"]
    script = (f"ABICACHE_STUB_{lib.upper()}_{stub.api_major} {{\n  global:\n"
              + "".join(f"    {e};\n" for e in exports) + "  local: *;\n};\n")
    return "\n".join(parts), script


_PRELUDE = r'''/* Generated by abicache: lazy-loading stub for lib{lib} (API of CUDA {api}).
 * Errors: {no_lib} = no library found, {no_sym} = symbol missing in the library loaded,
 * {sig} = the loaded major has another signature for this function.
 * abicache_stub_{lib}_report(buf, size) says what was tried; ABICACHE_STUB_DEBUG=1 prints it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <{header}>

#define ABICACHE_STUB_NO_LIBRARY {no_lib}
#define ABICACHE_STUB_NO_SYMBOL {no_sym}
#define ABICACHE_STUB_SIGNATURE {sig}

static void* stub_handle;
static int stub_major = -1;
static pthread_once_t stub_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t stub_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char stub_log[16384];
static size_t stub_log_len;
static const char* stub_sonames[{n}] = {{{sonames}}};
static const int stub_majors[{n}] = {{{majors}}};

static void stub_note(const char* fmt, ...) {{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&stub_log_lock);
    size_t n = strlen(line);
    if (stub_log_len + n + 2 < sizeof stub_log) {{
        memcpy(stub_log + stub_log_len, line, n);
        stub_log_len += n;
        stub_log[stub_log_len++] = '\n';
        stub_log[stub_log_len] = 0;
    }}
    pthread_mutex_unlock(&stub_log_lock);
    const char* debug = getenv("ABICACHE_STUB_DEBUG");
    if (debug && *debug && *debug != '0') fprintf(stderr, "abicache stub {lib}: %s\n", line);
}}

static int stub_try(const char* path, int major) {{
    dlerror();
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {{
        const char* why = dlerror();
        stub_note("tried %s: %s", path, why ? why : "unknown error");
        return 0;
    }}
    stub_handle = h;
    stub_major = major;
    stub_note("loaded %s (CUDA major %d)", path, major);
    return 1;
}}

static void stub_load(void) {{
    const char* override = getenv("ABICACHE_STUB_{upper}");
    if (override && *override) {{
        int major = -1;
        for (int i = 0; i < {n}; i++)
            if (strstr(override, stub_sonames[i])) major = stub_majors[i];
        if (stub_try(override, major)) return;
    }}
    for (int i = 0; i < {n}; i++)
        if (stub_try(stub_sonames[i], stub_majors[i])) return;
    stub_note("no lib{lib} could be loaded: calls return %d", ABICACHE_STUB_NO_LIBRARY);
}}

static void* stub_symbol(const char* name) {{
    pthread_once(&stub_once, stub_load);
    if (!stub_handle) return NULL;
    dlerror();
    void* p = dlsym(stub_handle, name);
    if (!p) {{
        const char* why = dlerror();
        stub_note("symbol %s: %s", name, why ? why : "not found");
    }}
    return p;
}}

static int stub_major_in(const int* majors, int count) {{
    for (int i = 0; i < count; i++)
        if (majors[i] == stub_major || stub_major < 0) return 1;
    return 0;
}}

int abicache_stub_{lib}_report(char* buf, size_t size) {{
    pthread_once(&stub_once, stub_load);
    pthread_mutex_lock(&stub_log_lock);
    if (buf && size) snprintf(buf, size, "%s", stub_log);
    int n = (int)stub_log_len;
    pthread_mutex_unlock(&stub_log_lock);
    return n;
}}

int abicache_stub_{lib}_major(void) {{
    pthread_once(&stub_once, stub_load);
    return stub_major;
}}
'''

_DRIVER_RESOLVE = r'''
typedef CUresult (*stub_getproc_t)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

static void* stub_driver_symbol(const char* name, const char* base, cuuint64_t flags) {
    pthread_once(&stub_once, stub_load);
    if (!stub_handle) return NULL;
    stub_getproc_t getproc = (stub_getproc_t)dlsym(stub_handle, "cuGetProcAddress_v2");
    if (getproc) {
        void* p = NULL;
        CUdriverProcAddressQueryResult status;
        if (getproc(base, &p, CUDA_VERSION, flags, &status) == CUDA_SUCCESS && p) return p;
        stub_note("cuGetProcAddress_v2(%s, version %d): not found (status %d)", base, CUDA_VERSION, (int)status);
    }
    return stub_symbol(name);
}
'''


def _function(func: StubFunction, lib: str) -> str:
    proto = func.prototype
    decl, arg_names, fn_type = _c_pieces(proto, func.name)
    fail = _failure_returns(proto.return_type, func.name)
    majors = ", ".join(map(str, func.majors))
    invoke = f"(({fn_type})f)({', '.join(arg_names)})"
    if proto.return_type in _ERROR_TYPES:  # the first failure of each function goes in the report
        call = (f"{proto.return_type} r = {invoke};\n"
                f"    static int noted;\n"
                f"    if (r != 0 && !__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED))\n"
                f"        stub_note(\"{func.name} returned %d (from the loaded CUDA %d)\", (int)r, stub_major);\n"
                f"    return r;")
    else:
        call = f"{'' if proto.return_type == 'void' else 'return '}{invoke};"
    if lib == "cuda":
        match = _SUFFIX.match(func.name)
        base = match.group(1) if match else func.name
        flags = "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM" if match and match.group(3) else "CU_GET_PROC_ADDRESS_DEFAULT"
        resolve = f'stub_driver_symbol("{func.name}", "{base}", {flags})'
    else:
        resolve = f'stub_symbol("{func.name}")'
    return f"""
{decl} {{
    static void* fn;
    static const int ok_majors[] = {{{majors}}};
    void* f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (!f) {{
        pthread_once(&stub_once, stub_load);
        if (!stub_handle) {fail['no_lib']}
        if (!stub_major_in(ok_majors, {len(func.majors)})) {{
            stub_note("{func.name}: the loaded CUDA %d has another signature (generated for {majors})", stub_major);
            {fail['sig']}
        }}
        f = {resolve};
        if (!f) {fail['no_sym']}
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }}
    {call}
}}"""


def _c_pieces(proto: headers.Prototype, name: str) -> tuple[str, list[str], str]:
    """(definition head with named parameters, argument names, function pointer type)."""
    text = proto.declaration.replace("extern ", "", 1)
    if "..." in text:
        raise AbicacheError(f"{name} is variadic; a stub cannot forward it")
    names = [f"a{i}" for i in range(len(proto.param_types))]
    params = ", ".join(_declare(t, n) for t, n in zip(proto.param_types, names)) or "void"
    head = f"{proto.return_type} {name}({params})" if "(*" not in proto.return_type else text
    fn_type = f"{proto.return_type} (*)({', '.join(proto.param_types) or 'void'})"
    return head, names, fn_type


def _declare(type_text: str, name: str) -> str:
    """A parameter declaration from a bare type: 'void **' -> 'void **a0', arrays and
    function pointers keep their shape."""
    if "(*)" in type_text:
        return type_text.replace("(*)", f"(*{name})", 1)
    if type_text.endswith("]"):
        base, _, dims = type_text.partition("[")
        return f"{base.rstrip()} {name}[{dims}"
    return f"{type_text} {name}"


def _failure_returns(ret: str, name: str) -> dict[str, str]:
    def give(code: int, what: str) -> str:
        if ret == "void":
            return "return;"
        if ret in _ERROR_TYPES:
            return f"return ({ret}){code};"
        if ret.endswith("*"):
            if "char" in ret:
                return f'return ({ret})"abicache stub: {what}";'
            return "return NULL;"
        return f"{{ {ret} r; memset(&r, 0, sizeof r); return r; }}"
    return {"no_lib": give(NO_LIBRARY, "no CUDA library could be loaded"),
            "no_sym": give(NO_SYMBOL, f"{name} is missing in the loaded library"),
            "sig": give(SIGNATURE, f"{name} has another signature in the loaded library")}


# ---- build ----------------------------------------------------------------------


def build(library: str, functions: Sequence[str], out_dir: Path, *, api_major: int | None = None,
          guard: bool = False, soname: str | None = None, header_dirs: dict[int, Path] | None = None,
          majors: Sequence[int] | None = None) -> Path:
    """Write <out>/abicache_<lib>_stub.c and .map, and build the shared library."""
    from ..cc import run_compiler

    stub = plan(library, functions, api_major=api_major, guard=guard, header_dirs=header_dirs, majors=majors)
    soname = soname or f"libabicache_{library}_stub.so"
    source, script = generate(stub, soname)
    out_dir = Path(out_dir).absolute()  # the compiler runs inside it: a relative --out would point elsewhere
    out_dir.mkdir(parents=True, exist_ok=True)
    c_file, map_file = out_dir / f"abicache_{library}_stub.c", out_dir / f"abicache_{library}_stub.map"
    c_file.write_text(source)
    map_file.write_text(script)
    target = out_dir / soname
    argv = ["cc", "-shared", "-fPIC", "-O2", "-Wall", f"-I{stub.include}", *headers.support_flags(),
            str(c_file), "-o", str(target),
            f"-Wl,-soname,{soname}", f"-Wl,--version-script={map_file}", "-Wl,-Bsymbolic", "-ldl", "-lpthread"]
    try:
        run_compiler(argv, out_dir, f"{library} stub")
    except BuildError as exc:
        raise BuildError(f"the generated {library} stub did not compile; this is a bug in abicache's "
                         f"generator for these functions: {', '.join(functions)}",
                         command=exc.command, output=exc.output) from None
    return target


"""The `abicache` commands: env, ls, show, explain, gc, check, verify, stats, audit, doctor, stub,
push, pull, remote, keys, demo, launcher, keeper (a compile, `abicache g++ ...`, never comes here:
cli/__init__.py hands it to the launcher).

Exit codes: 0 success; 1 the command found a problem (verify found damage,
explain found a miss, show found nothing); 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from ..settings import config
from .. import __version__
from ..errors import AbicacheError, missing_extra, unwritable_store
from . import COMMANDS, commands

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 too; say how to get help
        self.print_usage(sys.stderr)
        sys.stderr.write(f"abicache: error: {message}\nTry 'abicache --help'.\n")
        raise SystemExit(EXIT_USAGE)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with `only`, of that command alone (the others' parsers
    are not made: argparse looks up a translation of every help text, and the parsers of
    every command cost 15 ms of each run)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--dir", "--root", dest="root", type=Path,
                        help="the store (default: ABICACHE_DIR, the config file's dir, or the user cache dir)")
    parser = _Parser(prog="abicache", description="Build, cache and load compiled artifacts safely.")
    parser.add_argument("--version", action="version", version=f"abicache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    add: Any = sub if only is None else _Only(sub, only)

    add.add_parser("env", parents=[common], help="facts about this environment and settings")
    p = add.add_parser("ls", parents=[common], help="list cache entries",
                       description="The entries of the store, newest first within each name: kind, name, key "
                                   "(a prefix 'abicache show' takes), size, last use and requirements.",
                       epilog="example: abicache ls --kind cc.library")
    p.add_argument("--kind", help="only entries of this kind (e.g. cc.library)")
    p.add_argument("--all", "-a", action="store_true",
                   help="also the entries the build engine keeps for itself (cc.object, torch.pch)")
    p = add.add_parser("show", parents=[common], help="show the manifest of an entry")
    p.add_argument("key", help="a key or a unique prefix of one, or a name (its newest entry; see 'abicache ls')")
    p = add.add_parser("explain", parents=[common], help="why entries of NAME hit or miss, or why the last misses missed",
                       epilog="examples: abicache explain mylib --kind cc.library; abicache explain --last 3")
    p.add_argument("name", nargs="?")
    p.add_argument("--kind", help="artifact kind (default: every kind with this name)")
    p.add_argument("--last", type=_positive, nargs="?", const=5, metavar="N",
                   help="the last N misses of any process (default 5), against the entries there were then")
    p = add.add_parser("gc", parents=[common], help="evict entries by size and age")
    p.add_argument("--max-size", type=commands.parse_size,
                   help="e.g. 10G, 500M, 0 (default: the configured cap, ABICACHE_MAX_SIZE or max_size)")
    p.add_argument("--max-age", type=commands.parse_age, help="unused for longer than e.g. 30d, 12h")
    p.add_argument("--dry-run", action="store_true", help="report what would be removed")
    p.add_argument("--all", action="store_true",
                   help="clear the store: remove every entry (not the statistics nor the settings), as ccache -C")
    p = add.add_parser("check", parents=[common],
                       help="build entries again from scratch and compare: a stale key or a non-reproducible build",
                       description="Build entries again from scratch, in a scratch store, with the call that made "
                                   "them, and compare the bytes: 'same', 'stale key' (a fresh build read an input "
                                   "the entry did not record: it names it), 'not reproducible' (same inputs, other "
                                   "bytes), or 'skipped' (no recipe, or a lookup here would rebuild it anyway). "
                                   "Exit 1 when a key is stale. Example: abicache check --sample 5")
    p.add_argument("keys", nargs="*", metavar="KEY", help="keys or key prefixes (default: every entry with a recipe)")
    p.add_argument("--sample", type=_positive, metavar="N", help="check N entries chosen at random")
    p.add_argument("--log", action="store_true", help="also append the verdicts to the store's log/check.jsonl")
    p = add.add_parser("verify", parents=[common], help="check entries; quarantine damage")
    p.add_argument("--full", action="store_true", help="re-hash every file and blob")
    p = add.add_parser("stats", parents=[common], help="hits, misses, time saved; size, entries, sharing",
                       description="Hits (and those a hit record served), misses, builds, errors, the build time "
                                   "hits saved and why full lookups wrote no hit record, counted by every process "
                                   "that used this store (since --zero), and what the store holds.",
                       epilog="example: abicache stats --json | jq .counts.hit_rate")
    p.add_argument("--zero", "-z", action="store_true", help="start the counts again (as ccache -z)")
    assume = argparse.ArgumentParser(add_help=False)
    assume.add_argument("--assume", action="append", metavar="FACT=VALUE",
                        help="judge for another environment, e.g. gpu.arch=sm_80 (repeatable)")
    p = add.add_parser("audit", parents=[common, assume], help="what binaries need, with evidence")
    p.add_argument("files", nargs="+", metavar="FILE")
    p = add.add_parser("doctor", parents=[common, assume],
                       help="find binaries in existing JIT caches that cannot load here")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="folders to scan (default: torch_extensions, tvm-ffi, triton, flashinfer caches)")
    add.add_parser("demo", parents=[common], help="build, cache and load a C++ library and a module")
    p = add.add_parser("launcher", parents=[common],
                       help="build the compiler launcher's native front and print its path",
                       description="Build the compiler launcher's native front (once per store, with the C "
                                   "compiler) and print its path: set CMAKE_CXX_COMPILER_LAUNCHER or CC/CXX to it, "
                                   "as for ccache. It serves hits by stat alone and runs `abicache COMPILER ARGS...` "
                                   "in Python for the rest (docs/guides/launcher.md).")
    p.add_argument("--links", action="store_true",
                   help="print the folder of links named after compilers (g++, gcc, nvcc, ...) instead: first on "
                        "PATH, or as CXX=FOLDER/g++, each is that compiler's launcher (as /usr/lib/ccache)")
    p = add.add_parser("keeper", parents=[common],
                       help="the store's keeper: whether one runs, start or stop it",
                       description="The store's keeper is a process of yours that watches the files large hit "
                                   "records depend on (a torch extension's ~600 headers), so that a fresh process's "
                                   "hit asks it once instead of checking them all. A full lookup that writes such a "
                                   "record starts one; it exits after ABICACHE_KEEPER seconds without a question "
                                   "(docs/concepts.md).")
    p.add_argument("action", nargs="?", choices=["status", "start", "stop"], default="status")
    p = add.add_parser("bundle", parents=[common],
                       help="copy every variant of the named entries into a read-only store folder or a wheel "
                            "that registers it (ship prebuilt kernels)",
                       epilog="examples: abicache bundle --out dist/store mylib; "
                              "abicache bundle --wheel mylib-kernels==1.0 --out dist mylib mylib_ops; "
                              "abicache bundle --check --env python.abi=cp312 --env gpu.arch=sm_80 mylib")
    p.add_argument("names", nargs="+", metavar="NAME", help="entry names (every kind, variant and key of each)")
    p.add_argument("--out", type=Path, help="the store folder to make, or (--wheel) where the wheel goes")
    p.add_argument("--wheel", metavar="DIST==VERSION", help="write a wheel of this name and version instead")
    p.add_argument("--kind", help="only entries of this kind")
    p.add_argument("--from", dest="sources", action="append", type=Path, default=[], metavar="STORE",
                   help="also take entries from this store folder (another job's bundle); repeatable")
    p.add_argument("--split-by", choices=["none", "arch", "torch", "python"], default="none",
                   help="--wheel: a base wheel plus one provider wheel per GPU arch, torch or Python")
    p.add_argument("--max-size", type=commands.parse_size, metavar="SIZE",
                   help="--wheel: the largest wheel allowed (default 1.9G, under GitHub's 2 GiB asset limit)")
    p.add_argument("--remote", metavar="URL", dest="bundle_remote",
                   help="first fetch every variant of the named entries from this remote (s3://, redis://, file://)")
    p.add_argument("--check", action="store_true",
                   help="write nothing: say which variant would load in each --env (default: here), or what is missing")
    p.add_argument("--env", action="append", default=[], metavar="FACT=VALUE,...",
                   help="a target environment for --check: facts that differ from this machine's; repeatable")
    p = add.add_parser("stub", parents=[common], help="generate a lazy-loading CUDA stub library")
    p.add_argument("library", choices=["cudart", "nvrtc", "cuda"])
    p.add_argument("--functions", required=True, help="comma-separated API functions")
    p.add_argument("--out", required=True, type=Path, help="folder for the .c, .map and .so")
    p.add_argument("--api-major", type=int, help="headers the callers compile against (default: newest)")
    p.add_argument("--majors", help="CUDA majors the stub may load, e.g. 12,13 (default: all with headers)")
    p.add_argument("--guard", action="store_true",
                   help="allow functions whose signature differs: call them only on matching majors")
    p.add_argument("--soname", help="the stub's soname (default libabicache_<library>_stub.so)")
    _remote_commands(add, common)
    _describe(sub)
    return parser


class _Only:
    """add_subparsers' action, making only one command's parser; the others are _Unmade."""

    def __init__(self, sub: Any, only: str) -> None:
        self.sub, self.only = sub, only

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        return self.sub.add_parser(name, **kwargs) if name == self.only else _Unmade()


class _Unmade:
    """A command's parser that is not made: whatever is added to it is dropped."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


#: an example for each command's --help (ls, stats, check and config carry their own)
EXAMPLES = {
    "env": "abicache env --json",
    "show": "abicache show 8922dce0  (or a name: abicache show mylib)",
    "gc": "abicache gc --max-size 10G --max-age 30d --dry-run",
    "verify": "abicache verify --full",
    "check": "abicache check --sample 5 --log",
    "audit": "abicache audit build/libfoo.so --assume gpu.arch=sm_80",
    "doctor": "abicache doctor ~/.cache/torch_extensions",
    "demo": "abicache demo --root /tmp/abicache-demo",
    "launcher": 'cmake -B build -DCMAKE_CXX_COMPILER_LAUNCHER="$(abicache launcher)"',
    "keeper": "abicache keeper --json  (abicache keeper stop: every process then checks its records itself)",
    "stub": "abicache stub cudart --functions cudaMalloc,cudaFree --out stubs/",
    "push": "abicache push --kind cc.library --remote s3://bucket/abicache?endpoint=http://minio:9000",
    "pull": "abicache pull -j 16",
    "remote": "abicache remote stats --json; abicache remote prune --max-age 30d --dry-run",
    "keys": "abicache keys generate ci.key  (then ABICACHE_SIGNING_KEY=ci.key, ABICACHE_TRUSTED_KEYS=ci.key.pub)",
}


def _describe(sub: Any) -> None:
    """Every command's --help opens with what it does and ends with an example."""
    helps = {action.dest: action.help for action in sub._choices_actions}  # argparse keeps them only here
    for name, command in sub.choices.items():
        if not command.description and helps.get(name):
            command.description = helps[name][0].upper() + helps[name][1:] + "."
        if not command.epilog and name in EXAMPLES:
            command.epilog = f"example: {EXAMPLES[name]}"


def _remote_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--remote", metavar="URL", help="the remote store (default: ABICACHE_REMOTE)")
    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("--kind", help="only entries of this kind")
    select.add_argument("--name", help="only entries of this name")
    jobs = argparse.ArgumentParser(add_help=False)
    jobs.add_argument("--jobs", "-j", type=_positive, default=8, metavar="N",
                      help="entries moved at once (default 8)")
    sub.add_parser("push", parents=[common, remote, select, jobs], help="upload local entries to the remote")
    sub.add_parser("pull", parents=[common, remote, select, jobs],
                   help="fetch the remote's entries that can load here")
    p = sub.add_parser("remote", parents=[common, remote],
                       help="check the remote answers (default), show what it holds (stats), or prune it",
                       description="abicache remote [check]: settings and a round trip. "
                                   "abicache remote stats: entries, blobs and bytes the remote holds. "
                                   "abicache remote prune: delete broken entries, entries older than --max-age, "
                                   "the oldest while over --max-size, and blobs no entry names (after --grace); "
                                   "safe while other machines read and publish.")
    p.add_argument("action", nargs="?", default="check", choices=("check", "stats", "prune"))
    p.add_argument("--max-age", type=commands.parse_age, help="prune: entries created longer ago, e.g. 30d")
    p.add_argument("--max-size", type=commands.parse_size, help="prune: keep the blobs entries name under this, "
                                                              "e.g. 500G")
    p.add_argument("--grace", type=commands.parse_age, default=None,
                   help="prune: how long a blob no entry names is kept (default 1h)")
    p.add_argument("--dry-run", action="store_true", help="prune: report what would be deleted")
    p = sub.add_parser("config", parents=[common], help="settings in config files, and where each comes from",
                       description="Every setting can live in a TOML file as well as in its environment variable: "
                                   "the environment wins, then the user's ~/.config/abicache/config.toml, then the "
                                   "default. A store's abicache.toml sets the store's own settings (max_size, "
                                   "timeouts) and may only tighten the rest: never shared, dir, remote, "
                                   "read_stores, keys or check; dropin is read from the environment alone "
                                   "(docs/security.md).",
                       epilog="examples: abicache config set max_size 10G; abicache config get remote; "
                              "abicache config list --json")
    p.add_argument("action", choices=("list", "get", "set", "unset"), nargs="?", default="list")
    p.add_argument("name", nargs="?", help="a setting: max_size or ABICACHE_MAX_SIZE")
    p.add_argument("value", nargs="?", help="set: its value")
    p.add_argument("--store", action="store_true", help="set/unset in the store's abicache.toml, not the user's file")
    p = sub.add_parser("keys", parents=[common], help="signing keys for the remote tier")
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True
    g = actions.add_parser("generate", parents=[common], help="write an Ed25519 key pair: PATH and PATH.pub")
    g.add_argument("path", metavar="PATH")
    actions.add_parser("show", parents=[common], help="the signing key and trusted keys in effect")


def _module_of(command: str) -> Any:
    """The module of a command's handler, imported for its commands alone (the audit's, the
    remote's and the config's cost every other command ~10 ms); an extra one needs that is
    not installed is then named as the command's (main)."""
    if command in ("audit", "doctor", "stub"):
        from . import audit_cmds as module
    elif command in ("push", "pull", "remote", "keys"):
        from . import remote_cmds as module
    elif command == "config":
        from . import config_cmds as module
    else:
        module = commands
    return module


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = _intermixed(parser, argv) if argv[:1] == ["config"] else parser.parse_args(argv)
    try:
        return int(getattr(_module_of(args.command), f"cmd_{args.command}")(args) or EXIT_OK)
    except AbicacheError as exc:
        sys.stderr.write(f"abicache: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("abicache: interrupted\n")
        return 130
    except ImportError as exc:  # an optional part whose extra is not installed: say which
        missing = missing_extra(exc, f"abicache {args.command}")
        if missing is None:
            raise
        sys.stderr.write(f"abicache: error: {missing}\n")
        return EXIT_USAGE
    except BrokenPipeError:  # `abicache ls | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:  # a full or read-only store (gc, demo, a build): one line, not a traceback
        root = getattr(args, "root", None) or config.default_root()
        refused = unwritable_store(exc, root)
        if refused is None:
            raise
        sys.stderr.write(f"abicache: error: {refused}\n")
        return EXIT_USAGE


def _intermixed(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`config set --store max_size 1G`: options before its positionals (argparse hands the
    positionals after an option to no one, the subcommand's optional ones already matched empty)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[argv[0]]
    args = sub.parse_intermixed_args(argv[1:])
    args.command = argv[0]
    return args


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return int(text)


if __name__ == "__main__":
    raise SystemExit(main())

"""abicache command line: env, ls, show, explain, gc, check, verify, stats, audit, doctor, stub,
push, pull, remote, keys, demo.

Exit codes: 0 success; 1 the command found a problem (verify found damage,
explain found a miss, show found nothing); 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from .._version import __version__
from ..errors import AbicacheError
from . import audit_cmds, commands, remote_cmds

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 too; say how to get help
        self.print_usage(sys.stderr)
        sys.stderr.write(f"abicache: error: {message}\nTry 'abicache --help'.\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--root", type=Path, help="store root (default: ABICACHE_DIR or user cache dir)")
    parser = _Parser(prog="abicache", description="Build, cache and load compiled artifacts safely.")
    parser.add_argument("--version", action="version", version=f"abicache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    sub.add_parser("env", parents=[common], help="facts about this environment and settings")
    p = sub.add_parser("ls", parents=[common], help="list cache entries")
    p.add_argument("--kind", help="only entries of this kind (e.g. cc.library)")
    p = sub.add_parser("show", parents=[common], help="show the manifest of an entry")
    p.add_argument("key", help="a key or a unique prefix of one, or a name (its newest entry; see 'abicache ls')")
    p = sub.add_parser("explain", parents=[common], help="why entries of NAME hit or miss")
    p.add_argument("name")
    p.add_argument("--kind", help="artifact kind (default: every kind with this name)")
    p = sub.add_parser("gc", parents=[common], help="evict entries by size and age")
    p.add_argument("--max-size", type=commands.parse_size, help="e.g. 10G, 500M, 0")
    p.add_argument("--max-age", type=commands.parse_age, help="unused for longer than e.g. 30d, 12h")
    p.add_argument("--dry-run", action="store_true", help="report what would be removed")
    p = sub.add_parser("check", parents=[common],
                       help="build entries again from scratch and compare: a stale key or a non-reproducible build",
                       description="Build entries again from scratch, in a scratch store, with the call that made "
                                   "them, and compare the bytes: 'same', 'stale key' (a fresh build read an input "
                                   "the entry did not record: it names it), 'not reproducible' (same inputs, other "
                                   "bytes), or 'skipped' (no recipe, or a lookup here would rebuild it anyway). "
                                   "Exit 1 when a key is stale. Example: abicache check --sample 5")
    p.add_argument("keys", nargs="*", metavar="KEY", help="keys or key prefixes (default: every entry with a recipe)")
    p.add_argument("--sample", type=_positive, metavar="N", help="check N entries chosen at random")
    p.add_argument("--log", action="store_true", help="also append the verdicts to the store's log/check.jsonl")
    p = sub.add_parser("verify", parents=[common], help="check entries; quarantine damage")
    p.add_argument("--full", action="store_true", help="re-hash every file and blob")
    sub.add_parser("stats", parents=[common], help="size, entries, sharing")
    assume = argparse.ArgumentParser(add_help=False)
    assume.add_argument("--assume", action="append", metavar="FACT=VALUE",
                        help="judge for another environment, e.g. gpu.arch=sm_80 (repeatable)")
    p = sub.add_parser("audit", parents=[common, assume], help="what binaries need, with evidence")
    p.add_argument("files", nargs="+", metavar="FILE")
    p = sub.add_parser("doctor", parents=[common, assume],
                       help="find binaries in existing JIT caches that cannot load here")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="folders to scan (default: torch_extensions, tvm-ffi, triton, flashinfer caches)")
    sub.add_parser("demo", parents=[common], help="build, cache and load a C++ library and a module")
    p = sub.add_parser("stub", parents=[common], help="generate a lazy-loading CUDA stub library")
    p.add_argument("library", choices=["cudart", "nvrtc", "cuda"])
    p.add_argument("--functions", required=True, help="comma-separated API functions")
    p.add_argument("--out", required=True, type=Path, help="folder for the .c, .map and .so")
    p.add_argument("--api-major", type=int, help="headers the callers compile against (default: newest)")
    p.add_argument("--majors", help="CUDA majors the stub may load, e.g. 12,13 (default: all with headers)")
    p.add_argument("--guard", action="store_true",
                   help="allow functions whose signature differs: call them only on matching majors")
    p.add_argument("--soname", help="the stub's soname (default libabicache_<library>_stub.so)")
    _remote_commands(sub, common)
    return parser


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
    p = sub.add_parser("keys", parents=[common], help="signing keys for the remote tier")
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True
    g = actions.add_parser("generate", parents=[common], help="write an Ed25519 key pair: PATH and PATH.pub")
    g.add_argument("path", metavar="PATH")
    actions.add_parser("show", parents=[common], help="the signing key and trusted keys in effect")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = (audit_cmds if args.command in ("audit", "doctor", "stub")
              else remote_cmds if args.command in ("push", "pull", "remote", "keys") else commands)
    handler = getattr(module, f"cmd_{args.command}")
    try:
        return int(handler(args) or EXIT_OK)
    except AbicacheError as exc:
        sys.stderr.write(f"abicache: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("abicache: interrupted\n")
        return 130
    except BrokenPipeError:  # `abicache ls | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return int(text)


if __name__ == "__main__":
    raise SystemExit(main())

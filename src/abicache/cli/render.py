"""Output for people (rich tables) and for scripts (--json)."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Iterable, Sequence

from ..settings.config import human_size  # noqa: F401  (the commands' name for it)


def emit_json(doc: Any) -> None:
    """Indented; a long list (ls of a big store) a line per item instead: `indent` makes json
    use its Python encoder (40 us an entry), a line per item its C one (4 us). One write:
    json.dump writes each token on its own."""
    if isinstance(doc, list) and len(doc) > PLAIN_ROWS:
        lines = ",\n".join("  " + json.dumps(item, sort_keys=True, default=str) for item in doc)
        sys.stdout.write(f"[\n{lines}\n]\n")
        return
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
          optional: Sequence[str] = (), whole: Sequence[str] = ()) -> None:
    """A table; on a narrow terminal (< 100 columns) without borders between columns and
    without the `optional` ones, so rows stay on one line where they can. The `whole`
    columns (keys: copied and pasted) are never wrapped: other columns wrap instead."""
    rows = list(rows)
    if len(rows) > PLAIN_ROWS:
        plain_table(title, columns, rows)
        return
    from rich import box
    from rich.table import Table

    console = _console()
    narrow = console.width < 100
    keep = [i for i, col in enumerate(columns) if not (narrow and col in optional)]
    t = Table(title=title, title_justify="left", header_style="bold",
              **({"box": box.SIMPLE_HEAD, "pad_edge": False} if narrow else {}))
    for i in keep:
        if columns[i] in whole:
            t.add_column(columns[i], no_wrap=True, overflow="ignore", min_width=len(columns[i]))
        else:
            t.add_column(columns[i], overflow="fold")
    for row in rows:
        t.add_row(*("" if row[i] is None else str(row[i]) for i in keep))
    console.print(t)


#: above this many rows a table is plain text: rich takes 0.4 ms a row, and a long
#: listing is read with grep and less, a line a row, rather than on one screen
PLAIN_ROWS = 500


def plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns aligned with spaces, never wrapped (the last one runs on). Column by column
    (zip, map: loops in C): 10,000 rows of `ls` in a tenth of the time of a loop per cell."""
    cols = [list(col) for col in zip(*rows)] if rows else [[] for _ in columns]
    for i, col in enumerate(cols):
        if any(type(v) is not str for v in set(map(type, col))):
            cols[i] = ["" if v is None else str(v) for v in col]
    widths = [max(len(name), max(map(len, col), default=0)) for name, col in zip(columns, cols)]
    form = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}" if len(widths) > 1 else "{}"
    head = [form.format(*columns).rstrip(), form.format(*("-" * w for w in widths)).rstrip()]
    body = map(str.rstrip, map(form.format, *cols))
    sys.stdout.write("\n".join([title, *head, *body]) + "\n")


def say(text: str = "") -> None:
    _console().print(text, highlight=False)


def _console() -> Any:
    from rich.console import Console

    # Piped output (logs, CI) gets wide lines instead of 80-column wrapping.
    return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)




def ago(timestamp: float, now: float | None = None) -> str:
    delta = max(0.0, (time.time() if now is None else now) - timestamp)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if delta >= size:
            return f"{delta / size:.0f} {unit} ago"
    return f"{delta:.0f} s ago"


class Progress:
    """A rich progress bar on stderr on a terminal; in a log (CI), a line once
    work has run progress.LONG_SECONDS and then at most that often; silent
    when ABICACHE_PROGRESS=0. Safe to advance from worker threads."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label, self.total = label, total
        self._bar: Any = None
        self._done = 0
        self._lock = threading.Lock()
        self._start = self._said = time.perf_counter()
        self._log = False

    def __enter__(self) -> Progress:
        from ..console import progress

        mode = progress.mode()
        if mode == "on" and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress as Bar

            self._bar = Bar(console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        else:
            self._log = mode != "off"
        return self

    def advance(self, n: int = 1) -> None:
        from ..console import progress

        with self._lock:
            self._done += n
            if self._bar is not None:
                self._bar.advance(self._task, n)
            elif self._log and time.perf_counter() - self._said >= progress.LONG_SECONDS:
                self._said = time.perf_counter()
                progress.say(f"{self.label}: {self._done}/{self.total if self.total is not None else '?'} "
                             f"after {self._said - self._start:.0f} s")

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()

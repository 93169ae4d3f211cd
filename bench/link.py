"""A network link of a given rate between a client and a server on 127.0.0.1.

Loopback moves 100 MiB in a tenth of a second, faster than any fleet's network: what
compression saves there is the time bytes spend on a wire. This proxy forwards a TCP
connection both ways and lets the server's answers through at `rate` bytes per second (in
slices of 5 ms), so a transfer costs what it costs over a link of that rate: real sockets,
real bytes, the server unchanged (S3's signatures cover the host and port the client named,
which the proxy forwards as they are).

    with Link(("127.0.0.1", 8333), rate=125_000_000) as port:
        ... talk to 127.0.0.1:port ...
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

SLICE = 0.005


class Link:
    def __init__(self, upstream: tuple[str, int], rate: float) -> None:
        self.upstream, self.rate = upstream, rate
        self._server = socket.create_server(("127.0.0.1", 0))
        self._open: list[socket.socket] = []
        self._stop = threading.Event()

    def __enter__(self) -> int:
        threading.Thread(target=self._accept, daemon=True).start()
        return int(self._server.getsockname()[1])

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._server.close()
        for sock in self._open:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.rate), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, rate: float | None) -> None:
        budget, last = 0.0, time.monotonic()
        try:
            while True:
                if rate is not None:
                    now = time.monotonic()
                    budget = min(budget + (now - last) * rate, rate * SLICE * 4)
                    last = now
                    if budget < 1:
                        time.sleep(SLICE)
                        continue
                data = src.recv(int(budget) if rate is not None else 1 << 20)
                if not data:
                    break
                if rate is not None:
                    budget -= len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

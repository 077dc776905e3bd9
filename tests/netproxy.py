"""A loopback TCP forwarder whose connections can be cut, to stand in for a network drop."""

from __future__ import annotations

import selectors
import socket
import threading


class DropProxy:
    """Forwards 127.0.0.1:<port> to `target_port`. `cut()` drops every connection and refuses
    new ones, like a pulled cable; `restore()` listens again on the same port."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self.restore()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        listener.settimeout(0.05)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener

    def cut(self) -> None:
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            for a, b in self._pairs:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    s.close()
            self._pairs = []

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                listener, pairs = self._listener, list(self._pairs)
            if listener is not None:
                try:
                    client, _ = listener.accept()
                    upstream = socket.create_connection(("127.0.0.1", self.target_port))
                    with self._lock:
                        self._pairs.append((client, upstream))
                    continue
                except (TimeoutError, OSError):
                    pass
            self._forward(pairs)

    def _forward(self, pairs: list[tuple[socket.socket, socket.socket]]) -> None:
        selector = selectors.DefaultSelector()
        try:
            for a, b in pairs:
                selector.register(a, selectors.EVENT_READ, b)
                selector.register(b, selectors.EVENT_READ, a)
        except (ValueError, OSError):  # cut meanwhile
            return
        for key, _ in selector.select(timeout=0.02):
            try:
                data = key.fileobj.recv(1 << 16)
                if data:
                    key.data.sendall(data)
                    continue
            except OSError:
                pass
            self._drop_pair(key.fileobj)  # one end closed: close the other, as TCP would
        selector.close()

    def _drop_pair(self, end: socket.socket) -> None:
        with self._lock:
            for pair in [p for p in self._pairs if end in p]:
                self._pairs.remove(pair)
                for s in pair:
                    s.close()

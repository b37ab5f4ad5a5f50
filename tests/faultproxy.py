"""A fault-injecting HTTP/1.1 TCP proxy on 127.0.0.1 for the test S3 and Azure servers.

Put in front of a real server (moto, azurite), it forwards every connection unchanged until it is armed.
Armed, it cuts the next response: it reads the whole response from the server (so the request has taken
effect there), forwards only its first ``k`` bytes, ``k`` drawn uniformly from ``[0, length)`` (status
line, headers and body alike), and closes the client's connection. The client sees an answer cut off at a
random byte, as after a reset mid-response; it cannot tell whether its request took effect. A chunked
body is cut before its last chunk's size at the latest: what follows that ``0`` (the closing blank lines)
carries nothing, and an HTTP client reads an answer without it as whole, so such a cut would not be one.

Only the framing needed to find a response's end is parsed: the status line and headers, then a
Content-Length body, a chunked body, or none (HEAD, 1xx, 204, 304). Clients here never pipeline, so each
response answers the request whose line the proxy saw last on that connection.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CutCounts:
    """What the proxy did: responses forwarded whole and responses cut (by where the cut fell)."""

    responses: int = 0
    cuts: int = 0
    cuts_in_headers: int = 0
    cuts_in_body: int = 0
    by_method: dict[str, int] = field(default_factory=dict)


class _Reader:
    """Buffered reads from the upstream socket, keeping every byte read for forwarding."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.pos = 0

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        self.buffer += data

    def line(self) -> bytes:
        while True:
            end = self.buffer.find(b"\r\n", self.pos)
            if end >= 0:
                out = bytes(self.buffer[self.pos : end])
                self.pos = end + 2
                return out
            self._fill()

    def skip(self, n: int) -> None:
        while len(self.buffer) - self.pos < n:
            self._fill()
        self.pos += n

    def take(self) -> bytes:
        """The bytes of the response read so far; what is beyond stays for the next response."""
        out = bytes(self.buffer[: self.pos])
        del self.buffer[: self.pos]
        self.pos = 0
        return out


class FaultProxy:
    """A thread-based TCP proxy in front of ``upstream`` (``host:port``); see the module docstring."""

    def __init__(self, upstream_host: str, upstream_port: int, *, seed: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.counts = CutCounts()
        self.rng = random.Random(seed)
        self._armed = 0
        self._cut_chance = 0.0
        self._cut_when: Callable[[str, str], bool] | None = None
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="faultproxy", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ control
    def arm(self, cuts: int = 1) -> None:
        """Cut the next ``cuts`` responses (of any connection)."""
        with self._lock:
            self._armed += cuts

    def cut_randomly(self, chance: float) -> None:
        """Cut each response with probability ``chance`` (0 stops), besides any armed cuts."""
        with self._lock:
            self._cut_chance = chance

    def cut_when(self, matches: Callable[[str, str], bool] | None) -> None:
        """Cut every response to a request for which ``matches(method, target)`` holds (None stops)."""
        with self._lock:
            self._cut_when = matches

    def disarm(self) -> None:
        """Stop cutting."""
        with self._lock:
            self._armed = 0
            self._cut_chance = 0.0
            self._cut_when = None

    def _should_cut(self, method: str, target: str) -> bool:
        with self._lock:
            if self._cut_when is not None and self._cut_when(method, target):
                return True
            if self._armed:
                self._armed -= 1
                return True
            return self._cut_chance > 0 and self.rng.random() < self._cut_chance

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.close()
        self._listener.close()

    # ------------------------------------------------------------------ plumbing
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open |= {client, server}
            methods: deque[tuple[str, str]] = deque()
            ready = threading.Condition()
            threading.Thread(
                target=self._requests, args=(client, server, methods, ready), daemon=True
            ).start()
            threading.Thread(
                target=self._responses, args=(client, server, methods, ready), daemon=True
            ).start()

    def _shut(self, *socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
            with self._lock:
                self._open.discard(sock)

    def _requests(
        self,
        client: socket.socket,
        server: socket.socket,
        methods: deque[tuple[str, str]],
        ready: threading.Condition,
    ) -> None:
        """Client to server, unchanged; notes each request's method (data sent while no answer is due)."""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                with ready:
                    if not methods:
                        words = data.split(b"\r\n", 1)[0].split(b" ")
                        if len(words) == 3 and words[0].isalpha() and words[0].isupper():
                            methods.append((words[0].decode(), words[1].decode(errors="replace")))
                        else:  # not a request line: still expect an answer, never wait forever
                            methods.append(("?", ""))
                        ready.notify_all()
                server.sendall(data)
        except OSError:
            pass
        finally:
            with ready:
                methods.append(("", ""))  # wake the responses thread: no more requests
                ready.notify_all()
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_WR)

    def _responses(
        self,
        client: socket.socket,
        server: socket.socket,
        methods: deque[tuple[str, str]],
        ready: threading.Condition,
    ) -> None:
        reader = _Reader(server)
        try:
            while True:
                with ready:
                    while not methods:
                        ready.wait()
                    method, target = methods[0]
                if not method:
                    return
                framing = self._read_response(reader, method)
                data = reader.take()
                if framing is None:  # an interim 1xx answer: the real one follows
                    client.sendall(data)
                    continue
                headers_end, whole_at = framing
                with ready:
                    methods.popleft()
                if self._should_cut(method, target):
                    at = self.rng.randrange(whole_at)
                    with self._lock:
                        self.counts.cuts += 1
                        if at < headers_end:
                            self.counts.cuts_in_headers += 1
                        else:
                            self.counts.cuts_in_body += 1
                        self.counts.by_method[method] = self.counts.by_method.get(method, 0) + 1
                    client.sendall(data[:at])
                    return
                with self._lock:
                    self.counts.responses += 1
                client.sendall(data)
        except (OSError, EOFError):
            return
        finally:
            self._shut(client, server)

    @staticmethod
    def _read_response(reader: _Reader, method: str) -> tuple[int, int] | None:
        """Read one response; None for an interim 1xx, else the offset where its body starts and the
        bound of a cut's offset: its length, or for a chunked body the offset just past its last chunk's
        size (a client reads an answer that ends there as whole)."""
        status = int(reader.line().split(b" ", 2)[1])
        length: int | None = None
        chunked = False
        while True:
            line = reader.line()
            if not line:
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        headers_end = reader.pos
        if 100 <= status < 200:
            return None
        if method == "HEAD" or status in (204, 304):
            return headers_end, reader.pos
        if chunked:
            while True:
                size_at = reader.pos
                size = int(reader.line().split(b";", 1)[0], 16)
                if size == 0:
                    while reader.line():  # trailers, then the blank line
                        pass
                    # With the last chunk's "0" read, a client ends the body at the connection's end.
                    return headers_end, size_at + 1
                reader.skip(size + 2)
        elif length is not None:
            reader.skip(length)
        else:
            raise EOFError("a response without a length: the server closes the connection")
        return headers_end, reader.pos

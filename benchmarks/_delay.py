"""A delay line between the contenders and Azurite: cloud latency on loopback.

`python benchmarks/_delay.py LISTEN_PORT TARGET_PORT DELAY_MS` relays TCP
connections from 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT (TLS passes
through untouched). Every chunk is held DELAY_MS in each direction, pipelined
(the delay is added to each byte, the throughput is not divided by it), and
the first bytes of a new connection wait 2 x DELAY_MS more: the TCP
handshake's round trip. So a keep-alive request costs one round trip of
2 x DELAY_MS plus the server's time, a new TLS connection three or more.
Bandwidth is not limited and TCP's slow start is not emulated.

`DelayLine(target_port, delay_ms)` runs it as a subprocess (a context
manager; `.port` is where to connect). One thread, asyncio; prints
"listening PORT" once ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from pathlib import Path
from types import TracebackType

CHUNK = 256 * 1024


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, first: float
) -> None:
    """Forward what `reader` gives to `writer`, each chunk `delay` s later
    (the first `first` s more), in order; end of stream closes the writing side."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        extra = first
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((loop.time() + delay + extra, data))
                extra = 0.0
        except OSError:
            pass
        queue.put_nowait((loop.time() + delay, b""))

    async def write() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    try:
        await asyncio.gather(read(), write())
    except OSError:
        pass
    finally:
        writer.close()


async def _serve(listen: int, target: int, delay: float) -> None:
    async def one(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            _pump(client_r, server_w, delay, 2 * delay),  # the handshake's round trip
            _pump(server_r, client_w, delay, 0.0),
        )

    server = await asyncio.start_server(one, "127.0.0.1", listen, backlog=512)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class DelayLine:
    """The delay line as a subprocess, on a free port."""

    def __init__(self, target_port: int, delay_ms: float) -> None:
        self.target_port, self.delay_ms = target_port, delay_ms
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> DelayLine:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        argv = [sys.executable, str(Path(__file__).resolve()), str(free),
                str(self.target_port), str(self.delay_ms)]  # fmt: skip
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().split()
        if line[:1] != ["listening"]:
            self.__exit__(None, None, None)
            raise RuntimeError("the delay line did not start")
        self.port = int(line[1])
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


if __name__ == "__main__":
    listen_port, target_port, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(listen_port, target_port, delay_ms / 1000))

"""A TCP front for a Docker daemon's unix socket, so tests reach a daemon the way a pool reaches one on another
host (`tcp://...`), and can make it vanish, or slow to answer one kind of request."""

from __future__ import annotations

import asyncio
import re
import threading


class CuttableProxy:
    """TCP on loopback -> a daemon's unix socket. `cut()` drops every connection and stops listening (the host
    is gone, as far as its clients can tell); `restore()` listens again on the same port."""

    def __init__(self, unix_path: str):
        self.unix_path, self.port = unix_path, 0
        self.slow: re.Pattern[bytes] | None = None
        self.delay = 0.0
        self.seen = threading.Event()
        """Set when a request matching `slow` went to the daemon (its answer is being held back)."""
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._call(self._listen())

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self.unix_path)
        self.writers |= {writer, up_writer}
        held: list[float] = []  # delays owed to the answers on this connection

        async def copy(src, dst, requests: bool) -> None:
            try:
                while data := await src.read(1 << 16):
                    if requests and self.slow is not None and self.slow.search(data):
                        held.append(self.delay)
                        self.seen.set()
                    elif not requests and held:
                        await asyncio.sleep(held.pop(0))  # the daemon has done it; its answer comes late
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer, True), copy(up_reader, writer, False))

    def hold_answers(self, pattern: bytes, seconds: float) -> None:
        """From now on, answer requests whose bytes match `pattern` (a regex) `seconds` late: a daemon busy
        elsewhere. The request itself reaches the daemon at once."""
        self.slow, self.delay = re.compile(pattern), seconds
        self.seen.clear()

    def cut(self) -> None:
        async def down() -> None:
            self.server.close()
            for w in list(self.writers):
                w.transport.abort()
            self.writers.clear()

        self._call(down())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        self.cut()

        async def settle() -> None:  # let the pipes of cut connections end, so no task dies pending
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        self._call(settle())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

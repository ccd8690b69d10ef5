"""Bounded output capture: keep the head and the tail, count what was dropped in between.

Memory stays at most `limit` bytes per buffer however much a command prints (`yes` for ten seconds is
gigabytes); the head shows how a command started, the tail how it ended, which is what an agent needs.
"""

from __future__ import annotations


class CappedBuffer:
    def __init__(self, limit: int = 64 << 10):
        self.limit = max(limit, 2)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        head_room = self.limit // 2 - len(self._head)
        if head_room > 0:
            self._head += data[:head_room]
            data = data[head_room:]
        if data:
            keep = self.limit - self.limit // 2
            # Bounded: never hold more than one chunk beyond the tail's size.
            self._tail += data[-keep:]
            del self._tail[:-keep]

    @property
    def dropped(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def bytes(self) -> bytes:
        if not self.dropped:
            return bytes(self._head + self._tail)
        note = f"\n[... {self.dropped} bytes of output dropped ...]\n".encode()
        return bytes(self._head) + note + bytes(self._tail)

    def text(self) -> str:
        return self.bytes().decode("utf-8", errors="replace")


def truncate_text(text: str, budget: int) -> str:
    """The same head-and-tail cut for text already in memory (observation budgets)."""
    buf = CappedBuffer(budget)
    buf.write(text.encode("utf-8", errors="replace"))
    return buf.text()

"""Captured output cut to a server's limit, head and tail, with one note counting every byte dropped."""

from __future__ import annotations

import re

_CUT_NOTE = re.compile(r"\n\[\.\.\. (\d+) bytes of output dropped \.\.\.\]\n")


def cap_stream(text: str, limit: int, captured: int) -> str:
    """Cut a stream the shell captured (head and tail within `captured` bytes, with its note when it dropped
    some) down to `limit` bytes, head and tail again, with one note counting every byte dropped."""
    if limit >= captured or len(text) <= limit // 4:
        return text
    head, tail, dropped = text, "", 0
    if len(text.encode("utf-8", errors="replace")) > captured:  # the shell cut it: split at its note
        notes = list(_CUT_NOTE.finditer(text))
        if notes:
            note = min(notes, key=lambda m: abs(m.start() - len(text) // 2))
            head, tail, dropped = text[:note.start()], text[note.end():], int(note.group(1))
    head_b, tail_b = head.encode("utf-8", errors="replace"), tail.encode("utf-8", errors="replace")
    if not dropped and len(head_b) + len(tail_b) <= limit:
        return text
    joined = head_b + tail_b
    keep_head, keep_tail = limit // 2, limit - limit // 2
    dropped += len(joined) - keep_head - keep_tail
    return (joined[:keep_head].decode("utf-8", errors="replace")
            + f"\n[... {dropped} bytes of output dropped ...]\n"
            + joined[-keep_tail:].decode("utf-8", errors="replace"))

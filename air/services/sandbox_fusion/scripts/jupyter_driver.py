"""air's Jupyter driver for `/run_jupyter`. It runs inside a sandbox as the agent, as the warden's child
(`python3 -I -c <this file>`), and is written for that place only:

    stdin:  {"directory": the request's (made if missing, the kernel's cwd), "cells": [...], "cell_timeout": s,
             "total_timeout": s, "margin": s, "startup_timeout": s, "kernel": "python3", "memory_limit_MB": n,
             "stream_limit": chars, "budget": bytes}
    stdout: {"status": "Finished" | "TimeLimitExceeded" | "KernelDied" | "KernelSlow", "message": "...",
             "cells": [{"stdout", "stderr", "display", "error"}, ...]}

Why this shape:
- The result is written on a pipe no process of the cells holds: the kernel starts with stdout on /dev/null,
  stderr on a log file and every other descriptor closed, and this process makes itself non-dumpable first, so
  the cells (the same uid) can neither open /proc/<pid>/fd/N nor ptrace it. Their output reaches us only as
  kernel messages, and the deadlines are kept by this process's clock.
- `-I` (isolated mode): no directory of the request, no PYTHON* variable and no user site is on our import path,
  so a file the request uploads or a cell writes cannot replace a module this process imports later.
- A cell past cell_timeout, or the cells past total_timeout + margin (counted from this process's start, as
  upstream bounds its whole driver by total_timeout + 10 s), end the request: the kernel's process group is killed and the cells that ran so far are reported; the warden reaps
  whatever else the cells left when this process exits.
- The document must fit the warden's capture of our stdout (`budget`): each stream keeps its head and tail
  within `stream_limit` while it arrives, then the largest outputs are cut until the whole fits.
"""

import ctypes
import json
import os
import queue
import re
import resource
import subprocess
import sys
import time

NOTE = "\n[... {} bytes of output dropped ...]\n"
NOTE_RE = re.compile(r"\n\[\.\.\. (\d+) bytes of output dropped \.\.\.\]\n")
FIELDS = ("stdout", "stderr", "display", "error")
STARTED = time.monotonic()  # the driver's start: upstream's total bound counts from its driver's
PR_SET_DUMPABLE = 4


def nbytes(text):
    return len(text.encode("utf-8", "replace"))


def size(value):
    """Bytes `value` takes in the result document."""
    return len(json.dumps(value))


class Stream:
    """A cell's stdout or stderr as it arrives: the first and the last `limit // 2` characters, and a count of
    the bytes dropped between them."""

    def __init__(self, limit):
        self.head_room, self.tail_room = limit // 2, limit - limit // 2
        self.head, self.tail, self.dropped = "", "", 0

    def add(self, text):
        if len(self.head) < self.head_room:
            room = self.head_room - len(self.head)
            self.head, text = self.head + text[:room], text[room:]
        if text:
            self.tail += text
            if len(self.tail) > 2 * self.tail_room:  # amortised: trim once it doubled
                self.dropped += nbytes(self.tail[:-self.tail_room])
                self.tail = self.tail[-self.tail_room:]

    def text(self):
        if len(self.tail) > self.tail_room:
            self.dropped += nbytes(self.tail[:-self.tail_room])
            self.tail = self.tail[-self.tail_room:]
        return self.head + (NOTE.format(self.dropped) if self.dropped else "") + self.tail


class Cell:
    def __init__(self, stream_limit, display_room):
        self.out, self.err = Stream(stream_limit), Stream(stream_limit)
        self.display, self.error = [], []
        self.display_room = display_room  # bytes of display data kept in memory; the rest becomes a note

    def on(self, kind, content):
        if kind == "stream":
            (self.err if content.get("name") == "stderr" else self.out).add(str(content.get("text", "")))
        elif kind in ("display_data", "execute_result"):
            data = content.get("data", {})
            n = size(data)
            if n > self.display_room:
                data = dropped_display(1, n)
            self.display_room -= min(n, self.display_room)
            self.display.append(data)
        elif kind == "error":
            self.error.append(content)

    def result(self):
        return {"stdout": self.out.text(), "stderr": self.err.text(), "display": self.display,
                "error": self.error}


def dropped_display(count, nbytes_):
    return {"text/plain": f"[air: {count} display output(s) of {nbytes_} bytes dropped: past this server's "
                          f"output budget]"}


# ----- fitting the document into the budget --------------------------------------------------------------------
def cut_text(text, cap):
    """text, cut in the middle (head and tail kept, one note counting every byte dropped) to take at most `cap`
    bytes in the document."""
    if size(text) <= cap:
        return text
    dropped = sum(int(m.group(1)) for m in NOTE_RE.finditer(text))
    body = NOTE_RE.sub("", text)
    keep = min(len(body), max(cap, 0))
    while True:
        head, tail = body[:keep // 2], body[len(body) - (keep - keep // 2):] if keep else ""
        cut = head + NOTE.format(dropped + nbytes(body) - nbytes(head) - nbytes(tail)) + tail
        n = size(cut)
        if n <= cap or keep == 0:
            return cut
        keep = min(keep - 1, keep * cap // n)


def cut_list(items, cap, display):
    """A display or error list within `cap` bytes: the first items that fit, then one note for the rest."""
    if size(items) <= cap:
        return items
    kept, used = [], 2
    for i, item in enumerate(items):
        rest = items[i:]
        if display:
            note = dropped_display(len(rest), sum(map(size, rest)))
        else:  # an error keeps its name, and as much of its message and traceback as fits
            note = {"ename": str(item.get("ename", "")), "evalue": cut_text(str(item.get("evalue", "")), cap // 4),
                    "traceback": [cut_text("\n".join(map(str, item.get("traceback", []))), cap // 2)]}
        if used + size(item) + 2 + size(note) + 2 > cap:
            return kept + [note]
        kept.append(item)
        used += size(item) + 2
    return kept


def fit(document, budget):
    """Cut the largest outputs of the cells until the document takes at most `budget` bytes: every field gets
    the same ceiling, the largest that lets the whole fit (what is under it stays whole)."""
    if size(document) <= budget or not document["cells"]:
        return document
    slots = [(cell, key) for cell in document["cells"] for key in FIELDS]
    sizes = [size(cell[key]) for cell, key in slots]
    fixed = size(document) - sum(sizes)
    low, high = 0, max(sizes)
    while low < high:
        mid = (low + high + 1) // 2
        if fixed + sum(min(s, mid) for s in sizes) <= budget:
            low = mid
        else:
            high = mid - 1
    for (cell, key), n in zip(slots, sizes):
        if n > low:
            cell[key] = cut_text(cell[key], low) if key in ("stdout", "stderr") else \
                cut_list(cell[key], low, key == "display")
    return document


# ----- the run --------------------------------------------------------------------------------------------------
def undumpable():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def start_kernel(request, log_path):
    """A kernel in the current directory, with its stdout on /dev/null and its stderr on log_path; the data
    segment limit (memory_limit_MB > 0) applies to the kernel alone."""
    from jupyter_client import KernelManager

    manager = KernelManager(kernel_name=request["kernel"])
    limit_mb = int(request.get("memory_limit_MB", -1))
    saved = resource.getrlimit(resource.RLIMIT_DATA)
    with open(log_path, "wb") as log:
        try:
            if limit_mb > 0:
                hard = saved[1]
                soft = limit_mb << 20 if hard == resource.RLIM_INFINITY else min(limit_mb << 20, hard)
                resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
            manager.start_kernel(cwd=os.getcwd(), stdout=subprocess.DEVNULL, stderr=log,
                                 extra_arguments=["--HistoryManager.enabled=False"])
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, saved)
    return manager


def tail_of(path, limit=2000):
    try:
        with open(path, "rb") as f:
            return f.read()[-limit:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


def run_cells(request, manager, client):
    """(status, message, cells) once every cell ran, one ran too long, or the kernel died."""
    cells = []
    cell_timeout = float(request["cell_timeout"])
    # upstream's bound: the driver's whole run (start-up included) within total_timeout + its margin
    total_deadline = STARTED + float(request["total_timeout"]) + float(request.get("margin", 0.0))
    display_room = 4 * int(request["budget"])  # in memory; the document is fitted to the budget at the end
    for index, code in enumerate(request["cells"]):
        cell = Cell(int(request["stream_limit"]), display_room)
        cells.append(cell)
        started = time.monotonic()
        deadline = min(total_deadline, started + cell_timeout) if cell_timeout > 0 else total_deadline
        msg_id = client.execute(code, allow_stdin=False, stop_on_error=False)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                which = ("cell_timeout" if cell_timeout > 0 and started + cell_timeout <= total_deadline
                         else "total_timeout")
                limit = cell_timeout if which == "cell_timeout" else float(request["total_timeout"])
                return ("TimeLimitExceeded",
                        f"cell {index} ran past {which} ({limit:g}s): the kernel was killed"
                        + ("; later cells did not run" if index + 1 < len(request["cells"]) else ""),
                        cells)
            try:
                msg = client.get_iopub_msg(timeout=min(remaining, 0.25))
            except queue.Empty:
                if not manager.is_alive():
                    cell.error.append({"ename": "DeadKernelError", "evalue": "the kernel died while running "
                                       "this cell", "traceback": []})
                    return ("KernelDied", f"the kernel died while running cell {index}"
                            + ("; later cells did not run" if index + 1 < len(request["cells"]) else ""), cells)
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue  # output of an earlier cell's thread, or the kernel's own
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                break
            cell.on(kind, content)
        display_room = cell.display_room
    return "Finished", "", cells


def main():
    undumpable()
    # The result goes on a private copy of stdout; fd 1 becomes stderr, so a stray print of a library lands in
    # the log, never in the document.
    result = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    request = json.load(sys.stdin)
    os.makedirs(request["directory"], exist_ok=True)  # made by the upload when the request has files
    os.chdir(request["directory"])
    log_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"air-kernel-{os.getpid()}.log")
    manager = start_kernel(request, log_path)
    client = manager.client()
    client.start_channels()
    try:
        try:
            client.wait_for_ready(timeout=float(request["startup_timeout"]))
        except RuntimeError as exc:
            if manager.is_alive():
                status, message, cells = "KernelSlow", f"the kernel did not answer: {exc}", []
            else:
                status, message, cells = "KernelDied", ("the kernel exited before it was ready: "
                                                        + tail_of(log_path)), []
        else:
            status, message, cells = run_cells(request, manager, client)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)  # SIGKILL to its process group
    document = {"status": status, "message": message, "cells": [cell.result() for cell in cells]}
    budget = int(request["budget"])
    result.write(json.dumps(fit(document, budget)))
    result.close()


if __name__ == "__main__":
    main()

"""Servers' process housekeeping that must run without the package: the
descendants of a process, and the watchdog that stops a server whose parent
died without running its exit handlers (SIGKILL, or SIGTERM under Python's
default handler). The watchdog runs as a script (``python _watchdog.py PARENT
SERVER GRACE``), importing nothing but the standard library, so that it
watches from the moment it starts."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """The PIDs of a process's children, grandchildren, ... (Linux /proc; [] elsewhere)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def watch(parent: int, child: int, grace: float, poll: float = 1.0) -> None:
    """Wait while `parent` and `child` live; if the parent goes first, stop the
    child (SIGTERM, SIGKILL after `grace` s) and the processes it had started
    (known from the last poll: the child may go before them)."""
    kids: list[int] = []
    while alive(parent) and alive(child):
        kids = descendants(child) or kids
        time.sleep(poll)
    if alive(parent):
        return  # the server ended while its parent lives: the parent's stop() does the rest
    if alive(child):
        kids = descendants(child) or kids
        os.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
    for pid in (child, *kids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))

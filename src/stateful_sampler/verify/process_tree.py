"""Kill a run's whole process tree, whatever sessions its processes moved to.

A process group is not enough: torchrun (and so ``accelerate launch``) starts each rank in a session
of its own. The tree, read from /proc, is: freeze it with SIGSTOP until no new process appears (a
frozen process cannot fork), then SIGKILL every member, so none is left to start another.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and all its descendants; the calling process, if among them, dies last."""
    if sys.platform != "linux":  # no /proc: the process group is the best we have
        _send(root, signal.SIGKILL, group=True)
        return
    me = os.getpid()
    frozen: set[int] = set()
    while new := descendants(root) - frozen:
        for pid in new - {me}:
            _send(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen - {me}:
        _send(pid, signal.SIGKILL)
    _send(root, signal.SIGKILL, group=True)  # the run's group too, the caller last if it leads it


def descendants(root: int) -> set[int]:
    """``root`` and every process below it, from each process's parent in /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = _parent(entry)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _parent(entry: Path) -> int | None:
    try:
        text = (entry / "stat").read_text()
    except OSError:  # ended while we looked
        return None
    return int(text[text.rindex(")") + 2 :].split()[1])  # the name may hold spaces and parentheses


def _send(pid: int, number: signal.Signals, *, group: bool = False) -> None:
    try:
        if group:
            os.killpg(os.getpgid(pid), number)
        else:
            os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass  # already gone

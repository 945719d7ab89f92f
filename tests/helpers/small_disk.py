"""A small filesystem of its own (tmpfs), for tests of a full disk; not part of the package."""
from __future__ import annotations

import contextlib
import subprocess

import prerequisites


@contextlib.contextmanager
def small_disk(path, size: str):
    """Mounts a tmpfs of `size` (such as "1m") at `path`, made here; a missing prerequisite
    where this machine does not let us mount one (mounting needs root)."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        prerequisites.missing(f"a small filesystem of the test's own (mount -t tmpfs, as "
                              f"root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)

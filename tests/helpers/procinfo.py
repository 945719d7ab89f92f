"""Finds this machine's arrowstate Python workers (Linux /proc), for tests and benchmarks
(scripts/bench.py imports it from here); not part of the shipped package."""
from __future__ import annotations

import glob
import os
import signal


WORKERS = (b"arrowstate.worker", b"bench_lib.worker")   # the bench's wraps arrowstate's
DAEMON = b"arrowstate.worker_daemon"   # users' functions' workers are forked from it


def _args(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def state_worker_pids() -> list[int]:
    """Every state worker: started alone (`-m arrowstate.worker`) or forked by a worker
    daemon (a child with the daemon's command line)."""
    pids = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        pid = int(path.split("/")[2])
        args = _args(pid)
        if any(w in args for w in WORKERS) or (DAEMON in args and DAEMON in _args(parent_pid(pid))):
            pids.append(pid)
    return pids


def jvm_pid(worker: int) -> int:
    """The JVM a state worker serves: its parent, or its daemon's."""
    parent = parent_pid(worker)
    return parent_pid(parent) if DAEMON in _args(parent) else parent


def own_state_worker_pids() -> list[int]:
    """The state workers started by this process's own Spark (its JVM is our child)."""
    me = os.getpid()
    return [p for p in state_worker_pids() if parent_pid(jvm_pid(p)) == me]


def kill_own_state_workers() -> int:
    """SIGKILLs the state workers of this process's own Spark; how many there were."""
    killed = 0
    for pid in own_state_worker_pids():
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:   # it exited meanwhile (an idle worker stopping)
            continue
    return killed


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.readlines()
    except OSError:  # the process ended meanwhile
        return 0
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS:")), 0)


def descendants_cpu_seconds() -> float:
    """CPU seconds (user and system) this process's descendants have used: Spark's JVM and
    its Python workers. A live one counts its own time and its reaped children's, so a
    difference over a run covers workers that ended within it."""
    spent, children = {}, {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:   # ended meanwhile
            continue
        pid = int(path.split("/")[2])
        children.setdefault(int(fields[1]), []).append(pid)
        spent[pid] = sum(int(x) for x in fields[11:15])   # utime stime cutime cstime
    total, todo = 0, list(children.get(os.getpid(), ()))
    while todo:
        pid = todo.pop()
        total += spent[pid]
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) the process itself has used (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jvm_and_state_worker_cpu_seconds() -> tuple[float, float]:
    """CPU seconds of this process's own Spark JVM (its child `java`, driver and executor in
    local mode) and of that Spark's state workers, each process's own time: across a run,
    the difference is what each side spent (a state worker that ended within it is left
    out: pooled workers live across runs)."""
    me = os.getpid()
    jvms = [int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*/stat")
            if parent_pid(int(p.split("/")[2])) == me
            and _args(int(p.split("/")[2]))[0].endswith(b"java")]
    return (sum(map(own_cpu_seconds, jvms)),
            sum(map(own_cpu_seconds, own_state_worker_pids())))


def parent_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def parent_command(pid: int) -> str:
    """The command line of the JVM a state worker serves."""
    return b" ".join(_args(jvm_pid(pid))).decode(errors="replace")


def stop(process, timeout: float = 30) -> None:
    """Stops a process a test started (a subprocess.Popen): asked to end, then killed if it
    does not within `timeout` seconds."""
    import subprocess
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

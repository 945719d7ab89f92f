"""Starts the workers of users' functions by forking one process that has already imported
what they need (pandas, pyarrow, pyspark's streaming modules, arrowstate), so that a query
run's workers are ready in milliseconds instead of each spending a second of CPU on imports.

Spark's Python worker factory runs it as a daemon module (`python -m
arrowstate.worker_daemon`, one per interpreter and environment) and speaks to it as to
pyspark's own daemon: pyspark.daemon's `manager` (port or socket path on stdout, a fork per
connection, kills by pid on stdin, the children stopped with the daemon). Only what runs in
each child is ours: it authenticates as pyspark's children do and serves the JVM as
`arrowstate.worker` does, then exits.

pyspark's own daemon imports its worker module only after the fork, because pandas and
pyarrow start threads on import. Here the imports come first, as in Python's
`multiprocessing` forkserver with preloaded modules: the threads they start (numpy's BLAS
pool, Arrow's) are idle in the daemon, which never runs pandas or Arrow work itself, and
both libraries restart their pools in a forked child.
"""
from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket

from pyspark import daemon
from pyspark.serializers import UTF8Deserializer, write_with_length

from . import environment, worker
from .connection import Connection


def serve_forked(sock: socket.socket, authenticated: bool) -> int:
    """Runs in each forked child (pyspark.daemon's `worker` hook): the connection's
    authentication, then the worker's conversation; the child ends with it."""
    for sig in (signal.SIGHUP, signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)   # the daemon's handlers are not the worker's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fault_log = environment.enable_fault_log()
    worker.no_delay(sock)
    sock_file = sock.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536)))
    if not authenticated:
        ok = UTF8Deserializer().loads(sock_file) == os.environ["PYTHON_WORKER_FACTORY_SECRET"]
        write_with_length(b"ok" if ok else b"err", sock_file)
        sock_file.flush()
        if not ok:
            os._exit(1)
    code = worker.run(Connection(sock), fault_log)   # (sock_file is read no further)
    # exits here: pyspark's manager would serve the closed connection again when
    # SPARK_REUSE_WORKER is set
    os._exit(code)


def main() -> None:
    # a failed import is not the daemon's to report: each child imports again and tells
    # the task waiting for it why it cannot start
    with contextlib.suppress(Exception):
        worker.import_what_functions_need()
    # the modules' objects, shared with every child, stay out of the children's garbage
    # collections: a full one would walk them all (30 ms) and copy the pages it writes to
    gc.freeze()
    daemon.worker = serve_forked
    daemon.manager()


if __name__ == "__main__":
    main()

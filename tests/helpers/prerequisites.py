"""What a test needs beyond the package: Maven and the jars it downloads, a Kafka broker's,
Chromium, a Python module of the `test` extra, root to mount a small filesystem, a kernel
feature. Where one is missing the test cannot run, and says so: outside CI it is skipped,
its reason starting with SKIP_PREFIX (tests/conftest.py lists those skips in a section of
their own at the end of the run); in CI (`CI=true`, as .ci/run sets it) it fails, naming what
is missing, since .ci/run installs every one of them and a test that did not run must not
pass for one that did.

Skips that are part of a test's design (a `local_checkpoints` test while checkpoints are on
another store) are not missing prerequisites: they use pytest.skip as before."""
from __future__ import annotations

import importlib
import os
from typing import NoReturn

import pytest

SKIP_PREFIX = "missing prerequisite: "


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(what: str, allow_module_level: bool = False) -> NoReturn:
    """This test cannot run without `what` (what is missing, and why or how to get it):
    skipped outside CI, failed in CI."""
    if in_ci():
        pytest.fail(f"CI requires {what}", pytrace=False)
    pytest.skip(SKIP_PREFIX + what, allow_module_level=allow_module_level)


def module(name: str, why: str):
    """The module `name`, imported, where `why` needs it (a module's tests skip or fail as a
    whole without it, as pytest.importorskip, but failing in CI)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"the Python module {name!r} ({why}): {e}", allow_module_level=True)


def skip_reason(report) -> str | None:
    """A skipped test's (or module's) reason, as its report carries it (in this process or
    sent from a pytest-xdist worker): (path, line, 'Skipped: reason')."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    return None

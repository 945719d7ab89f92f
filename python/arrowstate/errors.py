"""Errors that carry a condition Spark's tools understand.

Where Spark has a condition for what went wrong (`CANNOT_LOAD_STATE_STORE.*`,
`STATE_STORE_*`, ...) the error carries it; where it has none, arrowstate's own, declared in
contract.json (`errors`). A failure in the worker crosses to the JVM in the ERROR frame as
its condition, message parameters, message and traceback (`error_payload`); the JVM raises it
as a SparkThrowable with that condition (ArrowStatePythonException), so a user, a test or
Spark's own error handling reads `getCondition()` instead of searching the message.
"""
from __future__ import annotations

import traceback
from typing import Any

PYTHON_ERROR = "ARROWSTATE_PYTHON_ERROR"
FAILED_TO_START = "ARROWSTATE_WORKER_FAILED_TO_START"


class ArrowStateError(Exception):
    """An error with its condition and message parameters; its text is `[CONDITION] message`,
    as Spark prints its own."""

    def __init__(self, condition: str, message: str, /, **parameters: Any) -> None:
        self.condition = condition
        self.message = message
        self.parameters = {k: str(v) for k, v in parameters.items()}
        super().__init__(f"[{condition}] {message}")


def condition_of(e: BaseException) -> tuple[str, dict[str, str], str]:
    """The condition, message parameters and message of any exception: ours, pyspark's own
    (a PySparkException raised in a user's function names its condition too), or any other
    (arrowstate's PYTHON_ERROR, naming its type)."""
    if isinstance(e, ArrowStateError):
        return e.condition, e.parameters, e.message
    get_condition = getattr(e, "getCondition", None)
    if callable(get_condition) and get_condition():
        parameters = getattr(e, "getMessageParameters", lambda: None)() or {}
        return get_condition(), {k: str(v) for k, v in parameters.items()}, str(e)
    return PYTHON_ERROR, {"errorType": type(e).__name__}, f"{type(e).__name__}: {e}"


def error_payload(e: BaseException, condition: str | None = None) -> dict[str, Any]:
    """The ERROR frame's payload for `e` (being handled): its condition (or the one given),
    message parameters, message and Python traceback."""
    found, parameters, message = condition_of(e)
    return {"condition": condition or found, "parameters": parameters, "message": message,
            "traceback": traceback.format_exc()}

"""Errors a model can act on: what happened, the script's line, what to do; never snapcell's own frames."""

from __future__ import annotations

import pytest

from snapcell import Limits
from snapcell.errors import PolicyError, ScriptError, ScriptSyntaxError, TimeLimitExceeded


def _fail(message):
    raise ValueError(message)


def test_syntax_error_points_at_the_line(run):
    error = run("x = 1\ny = (\n").error
    assert isinstance(error, ScriptSyntaxError) and error.lineno is not None
    text = error.for_model()
    assert "SyntaxError" in text and "Nothing ran" in text


def test_policy_error_says_what_where_and_instead(run):
    error = run("x = 1\nimport socket").error
    assert isinstance(error, PolicyError)
    text = error.for_model()
    assert "import of 'socket' is not allowed (line 2)" in text
    assert "import socket" in text and "Allowed modules:" in text


def test_time_limit_error_says_what_survives(run):
    error = run("while True:\n    pass", limits=Limits(wall_time_s=0.2)).error
    assert isinstance(error, TimeLimitExceeded)
    text = error.for_model()
    assert "stopped after 0.2 s" in text and "Earlier variables are still defined" in text


@pytest.mark.parametrize(
    "setup, code, line_text",
    [
        ("", "x = 1\n1 / 0", "1 / 0"),
        ("def helper(d):\n    return d['missing']", "helper({})", "return d['missing']"),
        ("", "[1 / (i - 2) for i in range(5)]", "[1 / (i - 2) for i in range(5)]"),
        ("", "fail('from the host')", "fail('from the host')"),
        ("", "raise SystemExit(2)", "raise SystemExit(2)"),
        ("def gen():\n    yield 1\n    raise KeyError('k')", "list(gen())", "raise KeyError('k')"),
        ("", "import json\njson.loads('{')", "json.loads('{')"),
    ],
    ids=["zero_division", "earlier_cell", "comprehension", "host_function", "system_exit", "generator", "stdlib"],
)
def test_tracebacks_show_script_frames_only(run, setup, code, line_text):
    lookup = {"fail": _fail}
    if setup:
        assert run(setup).error is None
    error = run(code, external_lookup=lookup).error
    assert isinstance(error, ScriptError)
    text = error.for_model()
    assert "snapcell" not in error.traceback_text and "snapcell" not in text
    assert "<cell-" in text and line_text in text
    assert error.lineno is not None


def test_base_exceptions_become_script_errors_with_a_hint(run):
    error = run("raise KeyboardInterrupt").error
    assert type(error) is ScriptError and error.exc_type == "KeyboardInterrupt"
    assert "cannot exit the session" in error.for_model()
    assert run("1 + 1").value == 2

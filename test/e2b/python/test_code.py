"""run_code through e2b-code-interpreter, sync and async: values, state, stdout per line, errors, callbacks,
display outputs and several results per cell, env, contexts, bash, timeouts."""

import pytest
from e2b import TimeoutException
from conftest import aw

pytestmark = pytest.mark.anyio


async def test_values_and_state(sbx):
    # numpy was imported in the parent before the snapshot: no import here.
    assert (await aw(sbx.run_code("numpy.arange(10).sum()"))).text == "45"
    await aw(sbx.run_code("counter = 41"))
    assert (await aw(sbx.run_code("counter + 1"))).text == "42"
    # E2B's server sends a string's text without its quotes.
    assert (await aw(sbx.run_code("'a string'"))).text == "a string"
    assert (await aw(sbx.run_code("x = 1"))).results == [], "a statement has no result"


async def test_stdout_and_stderr_stream_per_line(sbx):
    seen = []
    execution = await aw(
        sbx.run_code(
            "import sys\nprint('hello')\nprint('two', 'words')\nprint('to stderr', file=sys.stderr)\n"
            "sys.stdout.write('a\\nb\\nno newline')\n7",
            on_stdout=lambda m: seen.append(("out", m.line)),
            on_stderr=lambda m: seen.append(("err", m.line)),
        )
    )
    assert execution.text == "7"
    assert execution.logs.stdout == ["hello\n", "two words\n", "a\n", "b\n", "no newline"]
    assert execution.logs.stderr == ["to stderr\n"]
    assert [line for kind, line in seen if kind == "out"] == execution.logs.stdout
    assert ("err", "to stderr\n") in seen
    assert execution.execution_count >= 1


async def test_errors(sbx):
    errors = []
    failed = await aw(sbx.run_code("print('before')\n1 / 0", on_error=errors.append))
    assert failed.error.name == "ZeroDivisionError"
    assert "division by zero" in failed.error.value
    assert "ZeroDivisionError" in failed.error.traceback
    assert failed.logs.stdout == ["before\n"]
    assert errors and errors[0].name == "ZeroDivisionError"
    syntax = await aw(sbx.run_code("def broken(:"))
    assert syntax.error.name == "SyntaxError"


async def test_display_outputs_and_several_results(sbx):
    results = []
    execution = await aw(
        sbx.run_code(
            "class Bold:\n    def _repr_html_(self):\n        return '<b>bold</b>'\n"
            "    def __repr__(self):\n        return 'Bold()'\n"
            "class Data:\n    def _repr_json_(self):\n        return {'a': [1, 2]}\n"
            "print('first')\ndisplay(Bold())\ndisplay('shown', Data())\nprint('last')\nBold()",
            on_result=results.append,
        )
    )
    assert [(r.is_main_result, r.text) for r in execution.results] == [
        (False, "Bold()"),
        (False, "shown"),
        (False, execution.results[2].text),
        (True, "Bold()"),
    ]
    assert execution.results[0].html == "<b>bold</b>"
    assert execution.results[2].json == {"a": [1, 2]}, "json is an object, as E2B sends it"
    assert execution.results[3].html == "<b>bold</b>"
    assert execution.text == "Bold()", "the main result's text"
    assert [r.is_main_result for r in results] == [False, False, False, True], "on_result per result"
    assert execution.logs.stdout == ["first\n", "last\n"]


async def test_env_vars(sbx):
    assert (await aw(sbx.run_code("import os; os.environ['GREETING']"))).text == "from-create"
    both = await aw(
        sbx.run_code(
            "os.environ['GREETING'] + ' ' + os.environ['ONLY_HERE']",
            envs={"GREETING": "per-cell", "ONLY_HERE": "yes"},
        )
    )
    assert both.text == "per-cell yes"
    assert (await aw(sbx.run_code("os.environ.get('ONLY_HERE')"))).results == [], "restored after the cell"


async def test_contexts(sbx):
    await aw(sbx.run_code("in_default = 1"))
    context = await aw(sbx.create_code_context(cwd="/tmp"))
    assert context.language == "python"
    assert context.cwd == "/tmp"
    assert (await aw(sbx.run_code("in_default", context=context))).error.name == "NameError"
    assert (await aw(sbx.run_code("import os; os.getcwd()", context=context))).text == "/tmp"
    assert (await aw(sbx.run_code("numpy.arange(3).sum()", context=context))).text == "3", "warm names"
    assert any(c.id == context.id for c in await aw(sbx.list_code_contexts()))
    await aw(sbx.run_code("mine = 1", context=context))
    await aw(sbx.restart_code_context(context))
    assert (await aw(sbx.run_code("mine", context=context))).error.name == "NameError"
    await aw(sbx.remove_code_context(context.id))
    assert not any(c.id == context.id for c in await aw(sbx.list_code_contexts()))


async def test_bash(sbx):
    first = await aw(sbx.run_code("X=41; echo start; cd /tmp; echo oops >&2", language="bash"))
    assert first.error is None
    assert first.logs.stdout == ["start\n"]
    assert first.logs.stderr == ["oops\n"]
    second = await aw(sbx.run_code("echo $((X + 1)) $PWD", language="bash"))
    assert second.logs.stdout == ["42 /tmp\n"], "the default bash context keeps its state"
    failed = await aw(sbx.run_code("false", language="bash"))
    assert failed.error is not None and failed.error.value == "1", "a non-zero exit status is the error"
    shell = await aw(sbx.create_code_context(language="bash", cwd="/home/user"))
    assert shell.language == "bash"
    assert (await aw(sbx.run_code("pwd; echo ${X-unset}", context=shell))).logs.stdout == [
        "/home/user\n",
        "unset\n",
    ]
    await aw(sbx.remove_code_context(shell))


async def test_timeout_interrupts_the_cell(sbx):
    with pytest.raises(TimeoutException):
        await aw(sbx.run_code("import time\ntime.sleep(60)", timeout=3))
    # The interpreter is free again once the interrupted cell has unwound.
    assert (await aw(sbx.run_code("counter"))).text == "41"

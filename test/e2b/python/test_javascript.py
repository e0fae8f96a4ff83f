"""javascript contexts through e2b-code-interpreter, sync and async: a Node.js process per context where the
image has node (the interpreter tests' template), its names kept between cells; where it has none (pyagent),
an error naming what the image lacks."""

import pytest
from e2b import TimeoutException
from conftest import aw

pytestmark = pytest.mark.anyio


async def test_javascript_cells_keep_state_and_stream(interpreter, api):
    first = await aw(interpreter.run_code(f"var {api}Greeting = 'hi'; console.log({api}Greeting); 40 + 2",
                                          language="javascript"))
    assert first.error is None, first.error
    assert first.text == "42"
    assert first.logs.stdout == ["hi\n"]
    again = await aw(interpreter.run_code(f"{api}Greeting + '!'", language="javascript"))
    assert again.text == "hi!", "the default javascript context keeps its names"
    thrown = await aw(interpreter.run_code("console.log('before'); null.x", language="javascript"))
    assert thrown.error.name == "TypeError"
    assert thrown.logs.stdout == ["before\n"]
    awaited = await aw(interpreter.run_code("new Promise((resolve) => setTimeout(() => resolve(7), 20))",
                                            language="javascript"))
    assert awaited.text == "7"
    top_level = await aw(interpreter.run_code(f"const {api}Slept = await new Promise((r) => setTimeout(() => r(5), 20)); "
                                              f"{api}Slept * 2", language="javascript"))
    assert top_level.error is None, top_level.error
    assert top_level.text == "10", "top-level await, as E2B's kernel has it"
    assert (await aw(interpreter.run_code(f"{api}Slept", language="javascript"))).text == "5", "its names stay"
    envs = await aw(interpreter.run_code("process.env.ONLY_HERE", language="javascript",
                                         envs={"ONLY_HERE": "yes"}))
    assert envs.text == "yes"


async def test_javascript_contexts(interpreter, api):
    context = await aw(interpreter.create_code_context(language="javascript", cwd="/tmp"))
    assert context.language == "javascript"
    assert (await aw(interpreter.run_code(f"typeof {api}Greeting", context=context))).text == "undefined"
    assert (await aw(interpreter.run_code("process.cwd()", context=context))).text == "/tmp"
    with pytest.raises(TimeoutException):
        await aw(interpreter.run_code("while (true) {}", context=context, timeout=3))
    assert (await aw(interpreter.run_code("1 + 1", context=context))).text == "2", "usable after the interrupt"
    await aw(interpreter.remove_code_context(context.id))


async def test_javascript_without_node_names_what_the_image_lacks(sbx):
    with pytest.raises(Exception) as refused:
        await aw(sbx.run_code("1", language="javascript"))
    assert "node" in str(refused.value).lower(), refused.value
    with pytest.raises(Exception) as unknown:
        await aw(sbx.run_code("1", language="typescript"))
    assert "python, bash and javascript" in str(unknown.value), unknown.value

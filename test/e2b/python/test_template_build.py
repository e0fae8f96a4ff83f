"""E2B's Python `Template.build`, unmodified, against a real forkd daemon (started by
test/e2b/template-build-e2e.test.ts, which sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, and names the base image
in a loopback registry in FORKD_TEST_IMAGE and the build context in FORKD_TEST_CONTEXT).

One template with every instruction the SDK sends (ENV, WORKDIR, COPY, RUN as root and as another user, USER) and
a start command with a ready command; a sandbox created from it answers with the start command running; the same
template built again reuses every cached step; a failing step raises BuildException naming the step and its
output; a Dockerfile (parsed by the SDK) builds the same way. The sync API builds, the async API checks tags.
"""

import asyncio
import os
import re

import pytest
from e2b import AsyncTemplate, BuildException, Sandbox, Template

IMAGE = os.environ["FORKD_TEST_IMAGE"]
CONTEXT = os.environ["FORKD_TEST_CONTEXT"]
# The SDK runs commands as /bin/bash -l -c; the busybox test image gets a bash that is sh.
BASH_SHIM = os.environ["FORKD_TEST_BASH_SHIM"]
STEP_LINE = re.compile(r"^(base|step \d+/\d+): .* \((cached|[\d.]+ s)\)$")


def app_template():
    return (
        Template(file_context_path=CONTEXT)
        .from_image(IMAGE)
        .set_envs({"APP_MODE": "py-production", "GREETING": "from-python"})
        .set_workdir("/srv")
        .run_cmd(BASH_SHIM)
        .copy("site", "site/")
        .copy("config.ini", "/etc/app/", user="user", mode=0o640)
        .run_cmd('echo "built in $(pwd) as $(id -un)" > /srv/built.txt')
        .run_cmd("id -un > /home/user/ran-as", user="user")
        .set_user("user")
        .run_cmd('mkdir -p /home/user/data && echo "$APP_MODE" > /home/user/data/mode')
        .set_start_cmd(
            "httpd -f -p 8001 -h /srv/site",
            "wget -q -O /dev/null http://127.0.0.1:8001/index.html",
        )
    )


def messages(logs):
    return "\n".join(entry.message for entry in logs)


@pytest.fixture(scope="module")
def first_build():
    logs = []
    info = Template.build(app_template(), "py-app:v1", on_build_logs=logs.append, memory_mb=256)
    return info, messages(logs)


def test_build_every_instruction_and_run_its_start_command(first_build):
    info, text = first_build
    assert info.name == "py-app:v1"
    assert "Uploaded 'site'" in text or "Skipping upload of 'site'" in text, text[-3000:]
    assert re.search(r"step \d+/\d+: copy files/\d+/site -> /srv/site", text), text[-3000:]
    assert Template.exists("py-app")

    sandbox = Sandbox.create("py-app", timeout=600)
    try:
        page = sandbox.commands.run("wget -q -O - http://127.0.0.1:8001/index.html")
        assert page.stdout == "hello from a template build\n"
        out = sandbox.commands.run(
            "cat /srv/site/docs/a.txt /srv/built.txt /home/user/ran-as /home/user/data/mode"
        )
        assert out.stdout == "nested\nbuilt in /srv as root\nuser\npy-production\n"
        config = sandbox.commands.run("ls -l /etc/app/config.ini && cat /etc/app/config.ini", user="root")
        assert re.match(r"^-rw-r----- +1 user +user .*\n\[app\]\nmode=test\n$", config.stdout), config.stdout
        env = sandbox.commands.run('echo "$GREETING $(pwd) $(id -un)"')
        assert env.stdout == "from-python /srv user\n"
    finally:
        sandbox.kill()


def test_rebuild_reuses_every_cached_step(first_build):
    info, _ = first_build
    logs = []
    again = Template.build(app_template(), "py-app:v2", on_build_logs=logs.append, memory_mb=256)
    assert again.template_id == info.template_id
    assert again.build_id != info.build_id
    text = messages(logs)
    assert "Skipping upload of 'site', already cached" in text, text[-3000:]
    steps = [line for line in text.split("\n") if STEP_LINE.match(line)]
    assert len(steps) >= 10, text[-3000:]
    assert all(line.endswith("(cached)") for line in steps), "\n".join(steps)

    async def tags():
        return sorted(tag.tag for tag in await AsyncTemplate.get_tags("py-app"))

    assert asyncio.run(tags()) == ["v1", "v2"]
    Template.remove_tags("py-app", "v1")
    assert asyncio.run(tags()) == ["v2"]


def test_a_failing_step_names_the_step_and_its_output():
    failing = (
        Template()
        .from_image(IMAGE)
        .run_cmd("echo fine")
        .run_cmd("echo py-line-before-failure; echo py-oops >&2; exit 4")
    )
    with pytest.raises(BuildException) as raised:
        Template.build(failing, "py-failing")
    message = str(raised.value)
    assert re.search(r"step \d+/\d+: run echo py-line-before-failure.*failed \(exit status 4\)", message, re.S), message
    assert "py-line-before-failure" in message and "py-oops" in message, message
    assert not Template.exists("py-failing")


def test_a_dockerfile_parsed_by_the_sdk_builds():
    dockerfile = (
        f"FROM {IMAGE}\n"
        f"RUN {BASH_SHIM}\n"
        "ENV FROM_DOCKERFILE=py\n"
        "WORKDIR /work\n"
        'RUN echo "df $FROM_DOCKERFILE" > /work/out.txt\n'
        "USER user\n"
    )
    info = Template.build(Template().from_dockerfile(dockerfile), "py-dockerfile")
    assert Template.get_build_status(info).status.value == "ready"
    sandbox = Sandbox.create("py-dockerfile", timeout=300)
    try:
        assert sandbox.commands.run("cat /work/out.txt && id -un && pwd").stdout == "df py\nuser\n/work\n"
    finally:
        sandbox.kill()

"""Fixtures of the Python E2B tests: the unmodified `e2b` / `e2b-code-interpreter` packages against a real forkd
daemon (started by test/e2b/python-sdk-e2e.test.ts, which sets E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY).

Every test that takes `sbx` runs twice, through the sync API and through the async one, with the same
assertions: `await aw(call)` awaits what the async API returns and passes the sync API's value through. Few
VMs: one sandbox per API for the whole run (the async one is reached through AsyncSandbox.connect in each
test's own event loop).
"""

import asyncio
import inspect
import os
import secrets

import pytest
from e2b_code_interpreter import AsyncSandbox, Sandbox

LIFETIME_S = 1800
RUN = secrets.token_hex(4)
SUITE = os.environ.get("FORKD_TEST_SUITE", "py-e2e")
NETWORKS = os.environ.get("FORKD_TEST_NETWORKS") == "1"


async def aw(value):
    """The value of a call of either API: awaited when the async API returned an awaitable."""
    return await value if inspect.isawaitable(value) else value


@pytest.fixture(scope="session")
def anyio_backend():
    return "asyncio"


def create_options(api):
    return {
        "envs": {"GREETING": "from-create"},
        "metadata": {"suite": SUITE, "run": RUN, "api": api},
        "timeout": LIFETIME_S,
    }


@pytest.fixture(scope="session")
def sync_sandbox():
    sandbox = Sandbox.create(**create_options("sync"))
    yield sandbox
    sandbox.kill()


@pytest.fixture(scope="session")
def async_sandbox_id():
    async def create():
        sandbox = await AsyncSandbox.create(**create_options("async"))
        return sandbox.sandbox_id

    sandbox_id = asyncio.run(create())
    yield sandbox_id
    Sandbox.kill(sandbox_id)


@pytest.fixture(params=["sync", "async"])
def api(request):
    return request.param


@pytest.fixture
async def sbx(api, sync_sandbox, async_sandbox_id):
    if api == "sync":
        return sync_sandbox
    return await AsyncSandbox.connect(async_sandbox_id)


@pytest.fixture
def cls(api):
    """The sandbox class of the API under test (for its class methods: list, kill, fork, ...)."""
    return Sandbox if api == "sync" else AsyncSandbox

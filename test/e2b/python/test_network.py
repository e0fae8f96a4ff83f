"""Egress from the Python SDKs on a daemon whose default is deny (`forkd daemon --egress deny`, which
test/e2b/python-sdk-e2e.test.ts starts as root, beside the tests' own "internet"): the SDK's
allow_internet_access=True never widens the operator's default; allow_out names what a sandbox may reach; deny
and update_network as E2B defines them. The JS suite covers the same on an allow daemon."""

import json
import os

import pytest
from e2b import ALL_TRAFFIC, SandboxException
from conftest import NETWORKS, aw, create_options

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not NETWORKS, reason="sandbox networks need root"),
]

INTERNET = json.loads(os.environ.get("FORKD_TEST_INTERNET", "{}"))

FETCH_DEF = """
def fetch(url, timeout=6):
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return "OK " + response.read().decode()[:200]
    except Exception as err:
        return "ERR " + type(err).__name__
"""


async def fetch(sandbox, url, timeout=6):
    result = await aw(sandbox.run_code(f"fetch({url!r}, {timeout})"))
    assert result.error is None, result.error
    return result.text


async def test_the_default_is_the_daemons_deny(sbx):
    info = await aw(sbx.get_info())
    assert info.allow_internet_access is False
    await aw(sbx.run_code(FETCH_DEF))
    assert (await fetch(sbx, "http://other.test/")).startswith("ERR"), "no name resolves"
    assert (await fetch(sbx, f"http://{INTERNET['other']}/", 3)).startswith("ERR"), "no address answers"


async def test_allow_internet_access_true_does_not_widen_a_deny_daemon(cls, api):
    sandbox = await aw(cls.create(**create_options(f"{api}-net"), allow_internet_access=True))
    try:
        assert (await aw(sandbox.get_info())).allow_internet_access is False
        await aw(sandbox.run_code(FETCH_DEF))
        assert (await fetch(sandbox, f"http://{INTERNET['other']}/", 3)).startswith("ERR")

        # allow_out names what it may reach: the domain (through the sandbox's DNS) and the CIDR, nothing else.
        await aw(
            sandbox.update_network(
                {"allow_out": ["allowed.test", f"{INTERNET['cidrAllowed']}/32"], "deny_out": [ALL_TRAFFIC]}
            )
        )
        assert (await fetch(sandbox, "http://allowed.test/a")).startswith("OK")
        assert (await fetch(sandbox, f"http://{INTERNET['cidrAllowed']}/")).startswith("OK")
        assert (await fetch(sandbox, "http://other.test/")).startswith("ERR")
        assert (await fetch(sandbox, f"http://{INTERNET['other']}/", 3)).startswith("ERR")
        info = await aw(sandbox.get_info())
        assert sorted(info.network["allow_out"]) == [
            INTERNET["cidrAllowed"],
            "allowed.test",
        ]

        # An empty update gives it the default again: the daemon's deny.
        await aw(sandbox.update_network({}))
        assert (await fetch(sandbox, "http://allowed.test/a")).startswith("ERR")
    finally:
        await aw(sandbox.kill())


async def test_allow_out_at_create_and_a_bad_entry(cls, api):
    sandbox = await aw(
        cls.create(
            **create_options(f"{api}-allow"),
            network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]},
        )
    )
    try:
        await aw(sandbox.run_code(FETCH_DEF))
        assert (await fetch(sandbox, "http://allowed.test/x")).startswith("OK")
        assert (await fetch(sandbox, "http://other.test/")).startswith("ERR")
    finally:
        await aw(sandbox.kill())
    with pytest.raises(SandboxException) as refused:
        await aw(cls.create(**create_options(f"{api}-bad"), network={"allow_out": ["2001:db8::1"]}))
    assert "2001:db8::1" in str(refused.value)

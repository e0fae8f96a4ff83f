"""forkd v0.5 client code, run unmodified against this forkd (test_v05_replay.py runs this file).

Written the way forkd v0.5's own documentation uses its Python ``Controller``: its README's live-BRANCH snippet, the
``Controller`` docstring's spawn/branch/fan-out walk-through (with its ``per_child_netns=True``) and its recipes'
exec/eval calls. Nothing
in it knows it is not talking to v0.5: it imports ``Controller``/``ControllerError``, reads FORKD_URL and
FORKD_TOKEN as v0.5 did, spawns from a snapshot tagged "pyagent", and reads the v0.5 fields of every answer.
"""

import time

from forkd import Controller, ControllerError

c = Controller()

# README, "v0.4 live BRANCH": a live-fork source, then a fire-and-forget live BRANCH, polled until ready.
parent = c.spawn_sandboxes("pyagent", n=1, live_fork=True)[0]
branch = c.branch_sandbox(parent["id"], mode="live", wait=False)
assert branch["status"] in ("writing", "ready"), branch
deadline = time.time() + 300
while True:
    states = {s["tag"]: s["status"] for s in c.list_snapshots()}
    if states.get(branch["tag"]) == "ready":
        break
    assert time.time() < deadline, f"live branch {branch['tag']} never became ready: {states}"
    time.sleep(0.5)
print("live branch ready:", branch["tag"], "paused", branch["pause_ms"], "ms")
c.kill_sandbox(parent["id"])
c.delete_snapshot(branch["tag"])

# Controller docstring: list, spawn, branch a checkpoint, fan out grandchildren from it.
print("snapshots:", sorted(s["tag"] for s in c.list_snapshots()))
children = c.spawn_sandboxes("pyagent", n=1, per_child_netns=True)
sb_id = children[0]["id"]
assert children[0]["netns"].startswith("forkd-sb-"), children[0]
c.eval_code(sb_id, "memo = {'step': 1}")
branch = c.branch_sandbox(sb_id, tag="checkpoint-1")
assert branch["tag"] == "checkpoint-1", branch
assert branch["branched_from"] == sb_id, branch
assert isinstance(branch["pause_ms"], int), branch
grandchildren = c.spawn_sandboxes(branch["tag"], n=2)
print("grandchildren:", len(grandchildren))

# Recipes: exec_command with timeout_secs, eval_code against the warm interpreter, ping.
for kid in grandchildren:
    exec_result = c.exec_command(kid["id"], ["python3", "-c", "print(6 * 7)"], timeout_secs=15)
    assert (exec_result["stdout"], exec_result["exit_code"]) == ("42\n", 0), exec_result
    evaluated = c.eval_code(kid["id"], "memo['step'] + 1")
    assert (evaluated["result"], evaluated["error"], evaluated["exit_code"]) == ("2", None, 0), evaluated
print("zeros:", c.eval_code(sb_id, "numpy.zeros(5).tolist()")["result"])
print("pong:", c.ping_sandbox(sb_id).get("pong"))

info = c.get_sandbox(sb_id)
print("source branched:", info["has_branched"], info["branch_count"])
assert [s["id"] for s in c.list_sandboxes() if s["id"] == sb_id] == [sb_id]

try:
    c.get_sandbox("sb-abc-0000")
    raise AssertionError("an unknown sandbox must be an error")
except ControllerError as e:
    print("unknown sandbox:", e.status, e.body["error"])

for k in grandchildren + children:
    c.kill_sandbox(k["id"])
c.delete_snapshot(branch["tag"])
print("v0.5 usage: ok")

"""BRANCH: snapshot a sandbox mid-work, then fork children that continue from exactly there.

    python3 sdk/python/examples/branch.py

FORKD_SNAPSHOT names the starting snapshot (default "pyagent"). The branch is deleted at the end.
"""

import os

from forkd import Controller, Sandbox

tag = os.environ.get("FORKD_SNAPSHOT", "pyagent")
controller = Controller()

with Sandbox.create(snapshot_tag=tag, timeout=300) as source:
    # State in memory (the warm interpreter) and on disk.
    source.run_code("plan = ['read', 'think']")
    source.files.write("/root/notes.txt", "step 1 done\n")

    branch = source.branch(mode="diff")
    print(f"branched {branch['tag']} ({branch['mode']}) in a {branch['pause_ms']} ms pause")

    # The source keeps running and moves on; the branch does not see that.
    source.run_code("plan.append('source only')")

    children = Sandbox.create_many(2, snapshot_tag=branch["tag"], timeout=120)
    try:
        for i, child in enumerate(children):
            child.run_code(f"plan.append('child {i}')")
            notes = child.files.read("/root/notes.txt").strip()
            print(f"child {i}: plan={child.run_code('plan').result} notes={notes!r}")
    finally:
        for child in children:
            child.kill()
    print(f"source: plan={source.run_code('plan').result}")

controller.delete_snapshot(branch["tag"])
print(f"deleted {branch['tag']}")

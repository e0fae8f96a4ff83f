"""Fan-out: N sandboxes forked from one warm snapshot in a single request, one input each, in parallel.

    python3 sdk/python/examples/fan_out.py 8

FORKD_SNAPSHOT names the snapshot (default "pyagent", which must exist: `forkd snapshot --tag pyagent`).
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

from forkd import Sandbox

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
tag = os.environ.get("FORKD_SNAPSHOT", "pyagent")

sandboxes = Sandbox.create_many(n, snapshot_tag=tag, timeout=120)
try:
    print(f"{n} sandboxes from {tag}: {', '.join(sb.id for sb in sandboxes)}")

    def work(pair):
        index, sandbox = pair
        # Each child has its own memory: the same name holds a different value in each.
        return sandbox.run_code(f"x = numpy.full(3, {index}); int(x.sum())").result

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(work, enumerate(sandboxes)))
    for index, result in enumerate(results):
        print(f"child {index}: {result}")
    assert results == [str(3 * i) for i in range(n)], results
finally:
    for sandbox in sandboxes:
        sandbox.kill()

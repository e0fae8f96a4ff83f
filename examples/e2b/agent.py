"""An E2B agent, unchanged: it runs on E2B's cloud or on a forkd daemon, depending only on three environment
variables (see docs/e2b.md):

    export E2B_API_URL=http://127.0.0.1:8889 E2B_SANDBOX_URL=http://127.0.0.1:8889 E2B_API_KEY=<a daemon key>
    pip install e2b-code-interpreter
    python3 examples/e2b/agent.py

It computes in a sandbox, leaves state in memory and on disk, forks the sandbox two ways and lets each fork go
its own way from that state, at once (the async API).
"""

import asyncio

from e2b_code_interpreter import AsyncSandbox


async def follow(index, fork):
    if isinstance(fork, Exception):
        return f"fork {index} did not start: {fork}"
    try:
        step = await fork.run_code(f"history.append('fork {index}'); (samples * {index + 1}).sum(), history")
        disk = await fork.commands.run("cat notes.txt && hostname")
        return f"fork {index}: {step.text} | {disk.stdout.strip().replace(chr(10), ' | ')}"
    finally:
        await fork.kill()


async def main():
    sandbox = await AsyncSandbox.create(timeout=300)
    try:
        first = await sandbox.run_code("import numpy as np\nsamples = np.linspace(0, 1, 5)\nsamples.tolist()")
        print(f"samples: {first.text}")
        await sandbox.files.write("notes.txt", "written before the fork\n")
        await sandbox.run_code("history = ['parent']")

        forks = await sandbox.fork(count=2, timeout=120)
        for report in await asyncio.gather(*(follow(i, fork) for i, fork in enumerate(forks))):
            print(report)
        print(f"parent still has: {(await sandbox.run_code('history')).text}")
    finally:
        await sandbox.kill()


if __name__ == "__main__":
    asyncio.run(main())

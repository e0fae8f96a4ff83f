#!/usr/bin/env node
// Makes what the Python E2B tests need before they run (scripts/install-deps.sh calls it after the build): the
// venv with the newest e2b, e2b-code-interpreter, pytest and the frameworks (test/e2b/python/requirements.txt)
// and the wheels of the interpreter tests' template (test/e2b/code-interpreter), both with the machine's own pip
// configuration and cached outside the checkout (/var/cache/forkd/python-venvs), so a pip problem shows here
// rather than in the middle of a test run, and the tests reuse them.
import { codeInterpreterTemplate } from "../dist/test/support/code-interpreter-template.js";
import { e2bPythonVenv } from "../dist/test/support/python-venv.js";

const venv = await e2bPythonVenv();
console.log(
  `python test venv ${venv.dir}: e2b ${venv.versions.e2b}, e2b-code-interpreter ${venv.versions["e2b-code-interpreter"]}`,
);
console.log(`interpreter template ${await codeInterpreterTemplate()}`);

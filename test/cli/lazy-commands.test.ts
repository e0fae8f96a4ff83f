/** The CLI loads one command alone only when the invocation names that command and nothing that needs all. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { LAZY_COMMANDS, lazyCommand } from "../../src/cli/lazy-commands.js";

describe("lazy command start-up", () => {
  test("a lazy command is found after global options, with or without their values inline", () => {
    assert.equal(lazyCommand(["exec", "sb-0123456789ab", "--", "true"]), "exec");
    assert.equal(lazyCommand(["--daemon-url", "unix:/x", "exec", "sb-1"]), "exec");
    assert.equal(lazyCommand(["--daemon-token=t", "ls"]), "ls");
  });

  test("help, version, unknown and engine commands load everything", () => {
    for (const argv of [
      [],
      ["--help"],
      ["--version"],
      ["-V"],
      ["fork", "-t", "x"],
      ["daemon"],
      ["nope"],
      ["toString"],
    ]) {
      assert.equal(lazyCommand(argv), undefined, argv.join(" "));
    }
  });

  test("every lazy command's module registers a command of that name", async () => {
    const { Command } = await import("commander");
    for (const [name, load] of Object.entries(LAZY_COMMANDS)) {
      const program = new Command("forkd");
      (await load())(program);
      assert.ok(
        program.commands.some((c) => c.name() === name),
        `${name}: ${program.commands.map((c) => c.name())}`,
      );
    }
  });
});

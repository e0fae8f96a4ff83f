/** The watch-event filter that makes forkd's atomic uploads look like envd's in-place writes to a watcher. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { FsEvent } from "../../src/agent/host/types.js";
import { uploadEventFilter, uploadTemporary } from "../../src/e2b/envd/upload-names.js";

describe("upload temporaries in watch events", () => {
  it("hides the temporary and reports the upload landing as its target's create and write", () => {
    const temporary = uploadTemporary("/home/user/dir/new.txt");
    assert.match(temporary, /^\/home\/user\/dir\/\.new\.txt\.forkd-upload-[0-9a-f]{12}$/);
    const name = temporary.slice("/home/user/".length);
    const filter = uploadEventFilter();
    const reported: FsEvent[] = [
      { name, op: "create" },
      { name, op: "write" },
      { name, op: "chmod" },
      { name, op: "rename" },
      { name: "dir/new.txt", op: "create" },
      { name: "dir/other.txt", op: "create" },
      { name: "dir/new.txt", op: "remove" },
    ];
    assert.deepEqual(reported.flatMap(filter), [
      { name: "dir/new.txt", op: "create" },
      { name: "dir/new.txt", op: "write" },
      { name: "dir/other.txt", op: "create" },
      { name: "dir/new.txt", op: "remove" },
    ]);
  });

  it("passes a user's own dot files and renames through", () => {
    const filter = uploadEventFilter();
    const events: FsEvent[] = [
      { name: ".hidden", op: "create" },
      { name: ".x.forkd-upload-short", op: "create" },
      { name: "a.txt", op: "rename" },
      { name: "b.txt", op: "create" },
    ];
    assert.deepEqual(events.flatMap(filter), events);
  });
});

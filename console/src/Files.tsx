/** A sandbox's files: list a directory, open a subdirectory or a file (shown as text), go up. */
import { useState } from "preact/hooks";
import type { SandboxWire } from "../../src/console/protocol.js";
import { ApiError, type FileEntry, files } from "./api.js";
import { bytes } from "./format.js";

type Shown =
  | { kind: "dir"; path: string; entries: FileEntry[]; truncated: boolean }
  | { kind: "file"; path: string; text: string; bytes: number; truncated: boolean };

function join(dir: string, name: string): string {
  return dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
}

function parent(path: string): string {
  const cut = path.replace(/\/+$/, "").lastIndexOf("/");
  return cut <= 0 ? "/" : path.slice(0, cut);
}

export function Files({ sandbox: sb }: { sandbox: SandboxWire }) {
  const [path, setPath] = useState("/");
  const [shown, setShown] = useState<Shown | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);

  const open = async (target: string, kind: "dir" | "file") => {
    setBusy(true);
    setError(null);
    try {
      if (kind === "dir") {
        const listing = await files.list(sb.id, target);
        setShown({ kind: "dir", path: listing.path, entries: listing.entries, truncated: listing.truncated });
        setPath(listing.path);
      } else {
        setShown({ kind: "file", path: target, ...(await files.read(sb.id, target)) });
        setPath(target);
      }
    } catch (err) {
      setError(err instanceof ApiError ? err : new ApiError(0, "internal", String(err)));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section class="action" data-testid="files">
      <h3>Files</h3>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          void open(path, "dir");
        }}
      >
        <input
          class="mono"
          aria-label="guest path"
          value={path}
          onInput={(e) => setPath((e.target as HTMLInputElement).value)}
        />
        <button type="submit" disabled={busy || sb.status !== "running"}>
          List
        </button>
        <button
          type="button"
          disabled={busy || sb.status !== "running"}
          onClick={() => void open(path, "file")}
        >
          Open file
        </button>
      </form>
      {error && (
        <p class="error" role="alert" data-testid="files-error">
          {error.message}
          {error.status > 0 && (
            <span class="muted">
              {" "}
              ({error.status} {error.code})
            </span>
          )}
        </p>
      )}
      {shown?.kind === "dir" && (
        <ul class="file-list" data-testid="file-list">
          {shown.path !== "/" && (
            <li>
              <button type="button" class="link" onClick={() => void open(parent(shown.path), "dir")}>
                ..
              </button>
            </li>
          )}
          {shown.entries.map((entry) => (
            <li key={entry.name}>
              <button
                type="button"
                class="link mono"
                disabled={entry.type === "other"}
                onClick={() => void open(join(shown.path, entry.name), entry.type === "dir" ? "dir" : "file")}
              >
                {entry.name}
                {entry.type === "dir" ? "/" : ""}
              </button>{" "}
              <span class="muted">
                {entry.type === "symlink"
                  ? `→ ${entry.link_target ?? "?"}`
                  : entry.type === "file"
                    ? bytes(entry.size)
                    : ""}
              </span>
            </li>
          ))}
          {shown.truncated && <li class="muted">(more entries not shown)</li>}
        </ul>
      )}
      {shown?.kind === "file" && (
        <div class="output" data-testid="file-content">
          <pre>{shown.text}</pre>
          <span class="muted">
            {bytes(shown.bytes)}
            {shown.truncated ? ", only the start shown" : ""}
          </span>
        </div>
      )}
    </section>
  );
}

/**
 * Long tool output, kept small in results: text over a model-friendly size is cut to its head and tail with a
 * note, and the whole text is kept (bounded, oldest dropped first) as an MCP resource `forkd://outputs/<n>` the
 * client can read. One store per MCP session.
 */

/** Characters of one stream a tool result carries before it is truncated. */
export const RESULT_TEXT_CHARS = 8 * 1024;
/** The largest single output kept as a resource (bigger ones keep their last part). */
export const MAX_STORED_CHARS = 16 * 1024 * 1024;
/** All stored outputs of a session together; the oldest are dropped beyond this. */
export const MAX_STORE_CHARS = 64 * 1024 * 1024;

export const OUTPUT_URI_PREFIX = "forkd://outputs/";

export interface StoredOutput {
  uri: string;
  /** What produced it, e.g. "stdout of `make test` in sb-0123456789ab". */
  description: string;
  text: string;
}

export class OutputStore {
  private readonly outputs = new Map<string, StoredOutput>();
  private next = 1;
  private chars = 0;

  /**
   * `text` as it goes into a tool result: unchanged if short, else head + a note naming the resource that holds
   * all of it + tail.
   */
  shorten(text: string, description: string): { text: string; truncated: boolean; resource?: string } {
    if (text.length <= RESULT_TEXT_CHARS) return { text, truncated: false };
    const stored = this.put(text, description);
    const half = RESULT_TEXT_CHARS / 2;
    const note = `\n…[truncated: ${text.length} characters in all; the full text is the resource ${stored.uri}]…\n`;
    return {
      text: text.slice(0, half) + note + text.slice(-half),
      truncated: true,
      resource: stored.uri,
    };
  }

  get(uri: string): StoredOutput | undefined {
    return this.outputs.get(uri);
  }

  list(): StoredOutput[] {
    return [...this.outputs.values()];
  }

  private put(text: string, description: string): StoredOutput {
    const kept =
      text.length > MAX_STORED_CHARS
        ? `…[the first ${text.length - MAX_STORED_CHARS} characters were dropped]…\n${text.slice(-MAX_STORED_CHARS)}`
        : text;
    const stored = { uri: `${OUTPUT_URI_PREFIX}${this.next++}`, description, text: kept };
    this.outputs.set(stored.uri, stored);
    this.chars += kept.length;
    for (const [uri, old] of this.outputs) {
      if (this.chars <= MAX_STORE_CHARS || uri === stored.uri) break;
      this.outputs.delete(uri);
      this.chars -= old.text.length;
    }
    return stored;
  }
}

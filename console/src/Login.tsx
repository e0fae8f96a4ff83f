/** The login form: a daemon token in a password field, traded for a session cookie. */
import { useState } from "preact/hooks";
import type { ConsoleSession } from "../../src/console/protocol.js";
import { ApiError, session } from "./api.js";

export function Login({ onLoggedIn }: { onLoggedIn: (session: ConsoleSession) => void }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const next = await session.login(token);
      setToken("");
      onLoggedIn(next);
    } catch (err) {
      setError(err instanceof ApiError ? err.message : String(err));
    } finally {
      setBusy(false);
    }
  };

  return (
    <div class="center">
      <form class="login" onSubmit={(e) => void submit(e)}>
        <h1>forkd console</h1>
        <label for="token">Daemon token</label>
        <input
          id="token"
          name="token"
          type="password"
          autocomplete="current-password"
          value={token}
          onInput={(e) => setToken((e.target as HTMLInputElement).value)}
          required
        />
        <button type="submit" disabled={busy || token === ""}>
          {busy ? "Logging in…" : "Log in"}
        </button>
        {error && (
          <p class="error" role="alert" data-testid="login-error">
            {error}
          </p>
        )}
        <p class="muted">
          A token from the daemon's --token-file. It is sent once; the browser keeps a session cookie.
        </p>
      </form>
    </div>
  );
}

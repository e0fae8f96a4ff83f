/** The console: login (TCP), then the fork tree, the selection's details or the host panel, and terminals. */
import { useCallback, useEffect, useState } from "preact/hooks";
import type { ConsoleSession } from "../../src/console/protocol.js";
import { ApiError, session as sessionApi, setCsrf, whenUnauthorized } from "./api.js";
import { Details, type Selection } from "./Details.js";
import { HostPanel } from "./HostPanel.js";
import { Login } from "./Login.js";
import { connectFeed, disconnectFeed, useConsoleState } from "./store.js";
import { TerminalDock, type TerminalTab } from "./Terminals.js";
import { Tree } from "./Tree.js";

export function App() {
  const [session, setSession] = useState<ConsoleSession | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);

  const refresh = useCallback(async () => {
    try {
      const next = await sessionApi.get();
      setCsrf(next.csrf);
      setSession(next);
      setLoadError(null);
    } catch (err) {
      setLoadError(err instanceof ApiError ? `${err.message} (${err.code})` : String(err));
    }
  }, []);

  useEffect(() => {
    whenUnauthorized(() => void refresh());
    void refresh();
  }, [refresh]);

  useEffect(() => {
    if (!session?.authenticated) return;
    connectFeed(() => void refresh());
    return () => disconnectFeed();
  }, [session?.authenticated, refresh]);

  if (loadError !== null && session === null) {
    return (
      <div class="center">
        <p class="error" role="alert">
          Cannot reach the daemon: {loadError}
        </p>
      </div>
    );
  }
  if (session === null) return <div class="center">Loading…</div>;
  if (!session.authenticated) {
    return (
      <Login
        onLoggedIn={(next) => {
          setCsrf(next.csrf);
          setSession(next);
        }}
      />
    );
  }
  return <Console session={session} onLoggedOut={() => void refresh()} />;
}

function Console({ session, onLoggedOut }: { session: ConsoleSession; onLoggedOut: () => void }) {
  const state = useConsoleState();
  const [selection, setSelection] = useState<Selection | null>(null);
  const [pane, setPane] = useState<"details" | "host">("host");
  const [terminals, setTerminals] = useState<TerminalTab[]>([]);
  const [logoutError, setLogoutError] = useState<string | null>(null);
  const now = useNow();

  const select = useCallback((next: Selection) => {
    setSelection(next);
    setPane("details");
  }, []);
  const openTerminal = useCallback((sandboxId: string) => {
    setTerminals((open) => [...open, { key: `${sandboxId}-${Date.now()}-${open.length}`, sandboxId }]);
  }, []);
  const closeTerminal = useCallback((key: string) => {
    setTerminals((open) => open.filter((t) => t.key !== key));
  }, []);

  const logout = async () => {
    try {
      await sessionApi.logout();
      disconnectFeed();
      onLoggedOut();
    } catch (err) {
      setLogoutError(err instanceof ApiError ? err.message : String(err));
    }
  };

  const running = [...state.sandboxes.values()].filter((s) => s.status === "running").length;
  return (
    <div class="layout">
      <header>
        <h1 class="title">forkd console</h1>
        <span class="muted">daemon {session.version}</span>
        <span class={state.live ? "live" : "stale"} data-testid="feed-status">
          {state.live ? "live" : (state.feedError ?? "connecting…")}
        </span>
        <span class="muted">
          {state.snapshots.size} snapshots · {running} running sandboxes
        </span>
        <span class="spacer" />
        {logoutError && <span class="error">{logoutError}</span>}
        {session.auth === "login" ? (
          <button type="button" onClick={() => void logout()}>
            Log out
          </button>
        ) : (
          <span class="muted">{session.auth === "socket" ? "via the Unix socket" : "no login"}</span>
        )}
      </header>
      <main>
        <section class="tree-pane" aria-label="fork tree">
          <Tree state={state} selection={selection} onSelect={select} now={now} />
        </section>
        <section class="side-pane">
          <nav class="tabs">
            <button
              type="button"
              class={pane === "details" ? "active" : ""}
              onClick={() => setPane("details")}
            >
              Details
            </button>
            <button type="button" class={pane === "host" ? "active" : ""} onClick={() => setPane("host")}>
              Host
            </button>
          </nav>
          {pane === "details" ? (
            <Details
              selection={selection}
              state={state}
              features={session.features}
              now={now}
              onOpenTerminal={openTerminal}
              onSelect={select}
            />
          ) : (
            <HostPanel state={state} />
          )}
        </section>
      </main>
      {terminals.length > 0 && (
        <TerminalDock terminals={terminals} csrf={session.csrf} onClose={closeTerminal} />
      )}
    </div>
  );
}

/** The current time, once a second (ages and remaining lifetimes). */
function useNow(): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, []);
  return now;
}

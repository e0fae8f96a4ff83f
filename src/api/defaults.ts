/** Where the daemon listens unless told otherwise; imported by clients too, so it pulls in nothing else. */
export const DEFAULT_SOCKET_PATH = "/run/forkd/forkd.sock";
/** forkd v0.5's TCP address (its SDKs default to http://127.0.0.1:8889). */
export const DEFAULT_TCP_BIND = "127.0.0.1:8889";

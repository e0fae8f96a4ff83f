/**
 * The envd version forkd reports. The SDK gates features on it: 0.4.0 and later means the SDK sends a user only
 * when the caller names one (envd then uses its default user), 0.5.2 closeStdin, 0.5.7 octet-stream uploads
 * (streams, gzip), 0.6.2 file metadata (forkd answers 400: not supported), 0.6.3 watch events with their entry,
 * 0.6.4 watches on network mounts. Everything up to this version is served.
 */
export const ENVD_VERSION = "0.6.4";

/** E2B's default user of processes and files when a request names none (its home is /home/user). */
export const DEFAULT_USER = "user";

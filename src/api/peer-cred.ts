/**
 * Who is on the other end of a Unix socket connection: getsockopt(SO_PEERCRED) on the accepted socket's fd, via
 * koffi (Node has no API for it). The kernel records the credentials at connect time, so they cannot be forged by
 * the client. Used to name the caller in the audit log; access itself is decided by the socket file's mode/group.
 */
import type { Socket } from "node:net";

export interface PeerCredentials {
  pid: number;
  uid: number;
  gid: number;
}

const SOL_SOCKET = 1;
const SO_PEERCRED = 17;
/** struct ucred { pid_t pid; uid_t uid; gid_t gid; } */
const UCRED_BYTES = 12;

type GetSockOpt = (fd: number, level: number, name: number, value: Buffer, length: number[]) => number;

let getsockopt: Promise<GetSockOpt | null> | undefined;

/** Loaded once, lazily; null (and a caller named "unix") if koffi or libc is unavailable. */
function loadGetSockOpt(): Promise<GetSockOpt | null> {
  getsockopt ??= import("koffi")
    .then(({ default: koffi }) => {
      const libc = koffi.load("libc.so.6");
      return libc.func(
        "int getsockopt(int fd, int level, int name, _Out_ uint8_t *value, _Inout_ uint32_t *length)",
      ) as GetSockOpt;
    })
    .catch(() => null);
  return getsockopt;
}

/** Warms the binding so the first request does not pay for loading it. */
export async function peerCredentialsAvailable(): Promise<boolean> {
  return (await loadGetSockOpt()) !== null;
}

export async function peerCredentials(socket: Socket): Promise<PeerCredentials | null> {
  const call = await loadGetSockOpt();
  // libuv exposes the descriptor of a pipe/TCP handle as `fd`; it is -1 (or absent) once the socket is closed.
  const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (!call || typeof fd !== "number" || fd < 0) return null;
  const value = Buffer.alloc(UCRED_BYTES);
  const length = [UCRED_BYTES];
  if (call(fd, SOL_SOCKET, SO_PEERCRED, value, length) !== 0 || length[0] !== UCRED_BYTES) return null;
  return { pid: value.readInt32LE(0), uid: value.readUInt32LE(4), gid: value.readUInt32LE(8) };
}

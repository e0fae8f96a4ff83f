/**
 * The few libc calls Node lacks, bound through koffi (shipped next to the bundle in node_modules/koffi).
 * Loaded lazily and once: an agent that never needs them must not depend on the native module.
 */
export type LibcFunction = (...args: unknown[]) => unknown;

export interface Libc {
  clockSettime: LibcFunction;
  clockGettime: LibcFunction;
  /** Variadic: pass the third argument's type then its value, e.g. ioctl(fd, req, "void *", buffer). */
  ioctl: LibcFunction;
  /** Variadic like ioctl: fcntl(fd, cmd, "int", value). */
  fcntl: LibcFunction;
  sethostname: LibcFunction;
  errno: () => number;
  koffiVersion: string;
}

let libcPromise: Promise<Libc> | undefined;

export function loadLibc(): Promise<Libc> {
  libcPromise ??= (async () => {
    const koffi = (await import("koffi")).default;
    const libc = koffi.load("libc.so.6");
    koffi.struct("forkd_timespec", { tv_sec: "int64_t", tv_nsec: "int64_t" });
    return {
      clockSettime: libc.func("int clock_settime(int clock, const forkd_timespec *ts)") as LibcFunction,
      clockGettime: libc.func("int clock_gettime(int clock, _Out_ forkd_timespec *ts)") as LibcFunction,
      ioctl: libc.func("int ioctl(int fd, unsigned long request, ...)") as LibcFunction,
      fcntl: libc.func("int fcntl(int fd, int cmd, ...)") as LibcFunction,
      sethostname: libc.func("int sethostname(const uint8_t *name, size_t len)") as LibcFunction,
      errno: () => koffi.errno() as number,
      koffiVersion: String((koffi as unknown as { version?: unknown }).version),
    };
  })();
  return libcPromise;
}

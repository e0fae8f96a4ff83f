/*
 * forkd-ro-ram.so: preloaded into a confined QEMU (LD_PRELOAD) so that it opens the memory file of a
 * share=off memory backend read-only.
 *
 * QEMU 7.2 opens a memory-backend-file's mem-path O_RDWR even with share=off, where it only ever maps the file
 * MAP_PRIVATE (copy-on-write: a private writable mapping needs nothing but read access). A child's memory file
 * is the snapshot's RAM image, shared by every child of the snapshot; if the unprivileged QEMU could open it
 * read-write, a QEMU taken over by its guest could change the RAM every sibling and future child starts from.
 * With this, the image stays 0444, root's, on a read-only bind mount, and the kernel refuses any write to it.
 * (QEMU 8.2's memory-backend-file readonly=on,rom=off does this natively.)
 *
 * Only the exact paths in FORKD_RO_RAM (colon-separated) are affected, and only opens that ask for O_RDWR
 * without O_CREAT: everything else is passed to the kernel unchanged.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int listed(const char *path) {
  const char *list = getenv("FORKD_RO_RAM");
  if (list == NULL || path == NULL) return 0;
  size_t len = strlen(path);
  for (const char *p = list; *p != '\0';) {
    const char *end = strchr(p, ':');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len && strncmp(p, path, n) == 0) return 1;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

static int adjust(const char *path, int flags) {
  if ((flags & O_ACCMODE) == O_RDWR && !(flags & O_CREAT) && listed(path)) {
    return (flags & ~O_ACCMODE) | O_RDONLY;
  }
  return flags;
}

static int do_openat(int dirfd, const char *path, int flags, mode_t mode) {
  return (int)syscall(SYS_openat, dirfd, path, adjust(path, flags), mode);
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return do_openat(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return do_openat(AT_FDCWD, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return do_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return do_openat(dirfd, path, flags, mode);
}

/* What _FORTIFY_SOURCE builds call for an open without a mode argument. */
int __open_2(const char *path, int flags) { return do_openat(AT_FDCWD, path, flags, 0); }
int __open64_2(const char *path, int flags) { return do_openat(AT_FDCWD, path, flags, 0); }

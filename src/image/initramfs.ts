/**
 * Initramfs images: uncompressed newc cpio archives (the kernel unpacks them without a decompressor, which
 * is noticeably faster under TCG), written by Debian's GNU cpio from a staged tree.
 *
 * The boot initramfs is busybox + the driver modules + /init; /init configures the NIC (if any), mounts the
 * root disk and switch_roots to the guest agent, which becomes PID 1 (and reaps orphans). It never drops to a
 * shell: on failure it prints a marker line and powers off,
 * so the host sees a clear reason instead of a VM that hangs.
 */
import { createHash } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import {
  GATEWAY_IP,
  GATEWAY_MAC,
  GUEST_IFNAME,
  GUEST_IP,
  GUEST_NAMESERVER,
  GUEST_PREFIX_LENGTH,
} from "../common/guest-network.js";
import type { KernelModule } from "./kernel.js";
import { run } from "./run.js";

/** Printed by the probe initramfs once userspace runs; the accelerator probe waits for this line. */
export const PROBE_MARKER = "FORKD-PROBE-OK";
/** Printed (followed by ": <reason>") when the root disk cannot be mounted; the VM then powers off. */
export const ROOT_MOUNT_FAILED_MARKER = "FORKD-ROOT-MOUNT-FAILED";
/** Printed (followed by ": <reason>") for any other failure of /init before the agent starts. */
export const INIT_FAILED_MARKER = "FORKD-INIT-FAILED";

/**
 * Kernel command line the images are made for. `root=` is read by forkd's /init (default /dev/vda).
 * `nowatchdog`: no lockup-detector timers waking every idle child; under TCG each guest wake-up is emulated
 * at the host's expense, and a host with 100 idle children pays for all of them.
 */
export const KERNEL_CMDLINE = "console=ttyS0 loglevel=4 panic=-1 root=/dev/vda nowatchdog";

/** PID 1 of every guest: the static Go agent (no interpreter, no init in between; it reaps orphans itself). */
export const GUEST_AGENT_COMMAND = ["/opt/forkd/forkd-agent"];

/**
 * Kernel tunables /init sets before the agent starts, for the same reason as `nowatchdog`: periodic kernel
 * work an idle sandbox does not need (per-CPU vm statistics every second, proactive compaction).
 */
export const GUEST_SYSCTLS: Readonly<Record<string, string>> = {
  "vm/stat_interval": "60",
  "vm/compaction_proactiveness": "0",
};

/**
 * Digest of what the boot initramfs and command line are made from (the /init template, the sysctls, the agent
 * command, the command line). Part of every cache key, so a change to any of them rebuilds the images.
 */
export function bootRecipeDigest(): string {
  return createHash("sha256")
    .update(JSON.stringify([bootInitScript([]), KERNEL_CMDLINE]))
    .digest("hex");
}

/** Every file in an initramfs gets this mtime, so equal inputs give byte-identical archives. */
const FIXED_MTIME = new Date(0);

const BUSYBOX = "/bin/busybox";

/** The /init of the boot initramfs. Module names are file names under /lib/modules, in load order. */
export function bootInitScript(moduleNames: string[]): string {
  for (const name of moduleNames) {
    if (!/^[A-Za-z0-9_-]+$/.test(name)) throw new Error(`bad module name ${name}`);
  }
  const [agentBinary] = GUEST_AGENT_COMMAND;
  return `#!${BUSYBOX} sh
# forkd boot initramfs: load drivers, configure the NIC, mount the root disk, hand over to the guest agent.
# Never falls back to a shell: a failure prints a marker line on the console and powers off.
bb=${BUSYBOX}
$bb mount -t devtmpfs devtmpfs /dev
$bb mount -t proc proc /proc
$bb mount -t sysfs sysfs /sys

die() {
  echo "$1: $2"
  $bb poweroff -f
  while :; do $bb sleep 3600; done
}

for m in ${moduleNames.join(" ")}; do
  $bb insmod /lib/modules/$m.ko || echo "forkd-init: warning: cannot load module $m"
done

# The NIC, if the VM has one (virtio device id 1): the same static address, default route, gateway
# neighbour and resolver in every sandbox, so children restored from a snapshot need no network setup.
# The gateway's MAC is a permanent neighbour entry: identical in every sandbox's namespace, it stays valid
# across restores. No IPv6 (nothing routes it for a sandbox).
nic=
for d in /sys/bus/virtio/devices/*; do
  [ "$($bb cat "$d/device" 2>/dev/null)" = 0x0001 ] && nic=1
done
if [ -n "$nic" ]; then
  i=0
  while [ ! -e /sys/class/net/${GUEST_IFNAME} ] && [ $i -lt 300 ]; do $bb usleep 10000; i=$((i + 1)); done
  for f in all default; do echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6 2>/dev/null; done
  $bb ip link set lo up &&
    $bb ip link set ${GUEST_IFNAME} up &&
    $bb ip address add ${GUEST_IP}/${GUEST_PREFIX_LENGTH} dev ${GUEST_IFNAME} &&
    $bb ip route add default via ${GATEWAY_IP} dev ${GUEST_IFNAME} &&
    $bb arp -i ${GUEST_IFNAME} -s ${GATEWAY_IP} ${GATEWAY_MAC} ||
    die ${INIT_FAILED_MARKER} "cannot configure the network interface ${GUEST_IFNAME}"
fi

root=/dev/vda
for arg in $($bb cat /proc/cmdline); do
  case "$arg" in root=/dev/*) root="\${arg#root=}" ;; esac
done

# The block device node appears asynchronously after virtio_blk probes the disk.
i=0
while [ ! -b "$root" ] && [ $i -lt 300 ]; do $bb usleep 10000; i=$((i + 1)); done
[ -b "$root" ] || die ${ROOT_MOUNT_FAILED_MARKER} "no block device $root"
$bb mount -t ext4 -o rw "$root" /newroot || die ${ROOT_MOUNT_FAILED_MARKER} "cannot mount $root (ext4, rw) at /newroot"

[ -x "/newroot${agentBinary}" ] || die ${INIT_FAILED_MARKER} "root filesystem on $root has no ${agentBinary}"

if [ -n "$nic" ]; then
  $bb rm -f /newroot/etc/resolv.conf &&
    echo "nameserver ${GUEST_NAMESERVER}" > /newroot/etc/resolv.conf ||
    die ${INIT_FAILED_MARKER} "cannot write /etc/resolv.conf"
fi

$bb mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run || die ${INIT_FAILED_MARKER} "cannot mount /run"
$bb mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/tmp || die ${INIT_FAILED_MARKER} "cannot mount /tmp"
$bb mount --move /dev /newroot/dev && $bb mount --move /proc /newroot/proc && $bb mount --move /sys /newroot/sys ||
  die ${INIT_FAILED_MARKER} "cannot move /dev, /proc, /sys into the new root"
$bb mkdir -p /newroot/dev/pts /newroot/dev/shm
$bb mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts /newroot/dev/pts
$bb mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/dev/shm

for kv in ${Object.entries(GUEST_SYSCTLS)
    .map(([key, value]) => `${key}=${value}`)
    .join(" ")}; do
  echo "\${kv#*=}" > "/newroot/proc/sys/\${kv%%=*}" || echo "forkd-init: warning: cannot set sysctl \${kv%%=*}"
done

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
exec $bb switch_root /newroot ${GUEST_AGENT_COMMAND.join(" ")}
`;
}

/** The /init of the probe initramfs: proves the kernel reaches userspace on an accelerator, then powers off. */
export function probeInitScript(): string {
  return `#!${BUSYBOX} sh
echo ${PROBE_MARKER}
${BUSYBOX} poweroff -f
while :; do ${BUSYBOX} sleep 3600; done
`;
}

interface TreeEntry {
  rel: string;
  content?: Buffer | string;
  copyFrom?: string;
  mode: number;
}

/** Stages `entries` under `treeDir` (plus the directories and /dev/console every initramfs needs). */
async function stageTree(treeDir: string, entries: TreeEntry[], signal?: AbortSignal): Promise<void> {
  await fs.mkdir(treeDir, { recursive: true });
  for (const dir of ["bin", "dev", "proc", "sys", "newroot", "lib/modules"]) {
    await fs.mkdir(path.join(treeDir, dir), { recursive: true, mode: 0o755 });
  }
  for (const entry of entries) {
    const dest = path.join(treeDir, entry.rel);
    await fs.mkdir(path.dirname(dest), { recursive: true, mode: 0o755 });
    if (entry.copyFrom !== undefined) await fs.copyFile(entry.copyFrom, dest);
    else await fs.writeFile(dest, entry.content ?? "");
    await fs.chmod(dest, entry.mode);
  }
  // The kernel opens /dev/console for init's stdio before anything is mounted, so the node must be in the
  // archive itself (devtmpfs only appears once /init mounts it).
  await run("mknod", ["-m", "600", path.join(treeDir, "dev", "console"), "c", "5", "1"], { signal });
}

async function listTree(root: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (rel: string) => {
    const entries = await fs.readdir(path.join(root, rel), { withFileTypes: true });
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      const child = rel === "" ? e.name : `${rel}/${e.name}`;
      out.push(child);
      if (e.isDirectory()) await walk(child);
    }
  };
  await walk("");
  return out;
}

/** Writes `treeDir` as a newc cpio to `outFile`: entries sorted, owned by root, fixed mtimes. */
export async function writeCpio(treeDir: string, outFile: string, signal?: AbortSignal): Promise<void> {
  const entries = await listTree(treeDir);
  for (const rel of [...entries].reverse())
    await fs.lutimes(path.join(treeDir, rel), FIXED_MTIME, FIXED_MTIME);
  await run(
    "cpio",
    ["--create", "--format=newc", "--null", "--reproducible", "--owner=0:0", "--quiet", "-F", outFile],
    {
      cwd: treeDir,
      input: `${entries.join("\0")}\0`,
      signal,
      stdout: "ignore",
    },
  );
}

export async function buildBootInitramfs(
  outFile: string,
  workDir: string,
  busybox: string,
  modules: KernelModule[],
  signal?: AbortSignal,
): Promise<void> {
  const treeDir = path.join(workDir, "initramfs");
  await stageTree(
    treeDir,
    [
      { rel: "bin/busybox", copyFrom: busybox, mode: 0o755 },
      { rel: "init", content: bootInitScript(modules.map((m) => m.name)), mode: 0o755 },
      ...modules.map((m) => ({ rel: `lib/modules/${m.name}.ko`, copyFrom: m.file, mode: 0o644 })),
    ],
    signal,
  );
  await writeCpio(treeDir, outFile, signal);
}

export async function buildProbeInitramfs(
  outFile: string,
  workDir: string,
  busybox: string,
  signal?: AbortSignal,
): Promise<void> {
  const treeDir = path.join(workDir, "probe-initramfs");
  await stageTree(
    treeDir,
    [
      { rel: "bin/busybox", copyFrom: busybox, mode: 0o755 },
      { rel: "init", content: probeInitScript(), mode: 0o755 },
    ],
    signal,
  );
  await writeCpio(treeDir, outFile, signal);
}

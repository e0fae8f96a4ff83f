/**
 * `forkd doctor`: what works on this host, decided by trying things (a probe boot, creating a network
 * namespace), never by the mere presence of a device file, and what to do about each failure.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { access, constants, mkdir, readFile, statfs } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { errorMessage } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import { findCachedImage, listTemplates } from "../../image/index.js";
import { CGROUP_CONTROLLERS, detectCgroupLayout } from "../../isolation/cgroup.js";
import { confinementMode, resolveConfinement } from "../../isolation/confinement.js";
import { identityStatus } from "../../isolation/identity.js";
import { privateNetnsUnavailable } from "../../isolation/launcher.js";
import { unprivilegedUserfaultfd } from "../../isolation/userfaultfd.js";
import { resolveNetworkConfig } from "../../net/config.js";
import { bridgeOwnerTag, hostNetworkState } from "../../net/host.js";
import { formatCidr } from "../../net/ipv4.js";
import { netdBinary } from "../../net/netd-client.js";
import { qemuVersion } from "../../vmm/qemu-tools.js";
import { probeHost } from "../machines/accelerator.js";
import { homeKey } from "../machines/restore-plan.js";

const execFileAsync = promisify(execFile);

export type CheckStatus = "ok" | "warn" | "fail";

export interface DoctorCheck {
  name: string;
  status: CheckStatus;
  detail: string;
  /** What to do about a warn/fail. */
  fix?: string;
}

/** Below this, a pyagent snapshot (512 MiB RAM file + disk layer) plus a few children's overlays won't fit. */
export const MIN_FREE_DISK_BYTES = 2 * 1024 ** 3;
/** Host memory the doctor wants free: a parent VM plus tens of children. */
export const MIN_AVAILABLE_MEMORY_BYTES = 2 * 1024 ** 3;

export async function runDoctor(
  paths: ForkdPaths,
  options: { signal?: AbortSignal } = {},
): Promise<DoctorCheck[]> {
  const checks: DoctorCheck[] = [];
  const add = (check: DoctorCheck) => checks.push(check);

  add(await checkRoot());
  add(await checkQemu());
  add(await checkTool("qemu-img", ["--version"], "apt-get install qemu-utils"));
  add(await checkAccelerator(paths, options.signal));
  for (const [tool, pkg] of [
    ["mmdebstrap", "mmdebstrap"],
    ["dpkg-deb", "dpkg"],
    ["mkfs.ext4", "e2fsprogs"],
    ["cpio", "cpio"],
    ["modinfo", "kmod"],
  ] as const) {
    add(await checkTool(tool, ["--version"], `apt-get install ${pkg} (needed to build guest images)`));
  }
  add(await checkConfinement());
  // Format-2 templates only (images from OCI archives, registries, Dockerfiles; build steps): a warning.
  for (const [tool, pkg, what] of [
    ["skopeo", "skopeo", "format-2 templates from images and registries, forkd push/pull"],
    ["umoci", "umoci", "format-2 templates"],
    ["bwrap", "bubblewrap", "format-2 build steps"],
    ["buildah", "buildah", "format-2 templates from a Dockerfile"],
  ] as const) {
    const check = await checkTool(tool, ["--version"], `apt-get install ${pkg} (needed for ${what})`);
    add(check.status === "fail" ? { ...check, status: "warn" } : check);
  }
  add(await checkUserfaultfd());
  add(await checkCgroups(paths));
  add(await checkNetns());
  add(await checkTool("nft", ["--version"], "apt-get install nftables (sandbox egress policies and NAT)"));
  const netd = await checkTool(
    netdBinary(),
    ["-h"],
    "npm run build (the daemon's network helper, netns mode)",
  );
  add({ ...netd, name: "forkd-netd", ...(netd.status === "ok" ? { detail: netdBinary() } : {}) });
  add(await checkSandboxNetwork(paths));
  add(await checkDisk(paths));
  add(await checkMemory());
  return checks;
}

async function checkRoot(): Promise<DoctorCheck> {
  const uid = process.getuid?.() ?? -1;
  return uid === 0
    ? { name: "privileges", status: "ok", detail: "running as root" }
    : {
        name: "privileges",
        status: "warn",
        detail: `running as uid ${uid}`,
        fix: "run forkd as root (sudo -E forkd ...): it creates namespaces, cgroups and VMs",
      };
}

async function checkQemu(): Promise<DoctorCheck> {
  try {
    const v = await qemuVersion();
    return { name: "qemu", status: "ok", detail: `qemu-system-x86_64 ${v.version}` };
  } catch (err) {
    return {
      name: "qemu",
      status: "fail",
      detail: errorMessage(err),
      fix: "apt-get install qemu-system-x86 (or set FORKD_QEMU_BINARY)",
    };
  }
}

async function checkTool(tool: string, args: string[], fix: string): Promise<DoctorCheck> {
  try {
    const { stdout, stderr } = await execFileAsync(tool, args, { timeout: 10_000 });
    const first = `${stdout}${stderr}`.split("\n").find((l) => l.trim() !== "") ?? "";
    return { name: tool, status: "ok", detail: first.trim().slice(0, 100) };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // Some tools print their version and exit non-zero; being found is what matters.
    if (code !== "ENOENT") return { name: tool, status: "ok", detail: "present" };
    return { name: tool, status: "fail", detail: "not found", fix };
  }
}

async function checkAccelerator(paths: ForkdPaths, signal?: AbortSignal): Promise<DoctorCheck> {
  const kvmDevice = await access("/dev/kvm", constants.R_OK | constants.W_OK).then(
    () => "/dev/kvm present",
    () => "no /dev/kvm",
  );
  let image: Awaited<ReturnType<typeof findCachedImage>> | undefined;
  for (const template of await listTemplates()) {
    image = await findCachedImage(template);
    if (image) break;
  }
  if (!image) {
    return {
      name: "accelerator",
      status: "warn",
      detail: `not probed yet (${kvmDevice}): the probe boots the guest kernel, and no image is built`,
      fix: "forkd image build minimal   (then run forkd doctor again)",
    };
  }
  try {
    const probe = await probeHost(paths, image, { signal });
    if (probe.kvm.usable) return { name: "accelerator", status: "ok", detail: `kvm: ${probe.kvm.reason}` };
    if (probe.tcg.usable) {
      return {
        name: "accelerator",
        status: "warn",
        detail: `tcg (emulation, slow): kvm not usable: ${probe.kvm.reason}`,
        fix: "for KVM: a host with VT-x/AMD-V exposed (bare metal, or a VM with nested virtualisation) and kvm_intel/kvm_amd loaded",
      };
    }
    return {
      name: "accelerator",
      status: "fail",
      detail: `no accelerator boots the guest: kvm: ${probe.kvm.reason}; tcg: ${probe.tcg.reason}`,
      fix: "rebuild the image (forkd image build minimal --force) and check the QEMU installation",
    };
  } catch (err) {
    return {
      name: "accelerator",
      status: "fail",
      detail: errorMessage(err),
      fix: "check the QEMU installation",
    };
  }
}

async function checkConfinement(): Promise<DoctorCheck> {
  const mode = confinementMode();
  try {
    const config = await resolveConfinement(mode);
    if (config.mode === "off") {
      return {
        name: "confinement",
        status: "warn",
        detail: config.summary,
        fix: "unset FORKD_CONFINEMENT (or --confinement on): QEMU then never runs as root",
      };
    }
    if (!config.uids) {
      return { name: "confinement", status: "warn", detail: config.summary, fix: "run forkd as root" };
    }
    const identity = await identityStatus(config.uids);
    const end = config.uids.base + config.uids.count - 1;
    return {
      name: "confinement",
      status: "ok",
      detail:
        `${config.summary}; uids ${config.uids.base}..${end} reserved for ${identity.user} in /etc/subuid and ` +
        "/etc/subgid (the daemon creates the user and the reservation if missing; so does scripts/install-deps.sh)",
    };
  } catch (err) {
    return {
      name: "confinement",
      status: "fail",
      detail: errorMessage(err),
      fix: "see docs/security.md (Confinement); FORKD_VM_UID_BASE picks another uid range",
    };
  }
}

async function checkUserfaultfd(): Promise<DoctorCheck> {
  const value = await unprivilegedUserfaultfd();
  if (value === null) {
    return {
      name: "userfaultfd",
      status: "warn",
      detail: "kernel has no userfaultfd sysctl",
      fix: "live BRANCH (background snapshot) needs a kernel with CONFIG_USERFAULTFD",
    };
  }
  return {
    name: "userfaultfd",
    status: "ok",
    detail:
      value === "1"
        ? "vm.unprivileged_userfaultfd=1: live BRANCH works for unprivileged QEMUs (and every local user may use userfaultfd)"
        : "vm.unprivileged_userfaultfd=0: the daemon sets it to 1 at the first live BRANCH of a confined QEMU " +
          "(QEMU 7.2 needs it), unless started with --no-unprivileged-userfaultfd",
  };
}

async function checkCgroups(paths: ForkdPaths): Promise<DoctorCheck> {
  const layout = await detectCgroupLayout(homeKey(paths.home));
  const found = CGROUP_CONTROLLERS.map((c) => {
    const h = layout.hierarchies[c];
    return h
      ? `${c}: v${h.version} (${path.dirname(path.dirname(h.parent))})`
      : `${c}: missing (${layout.missing[c]})`;
  });
  const missing = CGROUP_CONTROLLERS.filter((c) => !layout.hierarchies[c]);
  const swap = layout.hierarchies.memory && !layout.swapAccounted ? "; swap is not accounted (memsw)" : "";
  return {
    name: "cgroups",
    status: missing.length === 0 ? "ok" : "warn",
    detail: `per-sandbox limits: ${found.join("; ")}${swap}`,
    fix:
      missing.length === 0
        ? undefined
        : `without ${missing.join(", ")} those limits are not applied by default and refused (501) when a spawn asks for them`,
  };
}

async function checkNetns(): Promise<DoctorCheck> {
  const name = `forkd-doctor-${randomBytes(3).toString("hex")}`;
  try {
    await execFileAsync("ip", ["netns", "add", name], { timeout: 10_000 });
    await execFileAsync("ip", ["netns", "delete", name], { timeout: 10_000 });
    return { name: "netns", status: "ok", detail: "created and removed a network namespace" };
  } catch (err) {
    await execFileAsync("ip", ["netns", "delete", name]).catch(() => {});
    return {
      name: "netns",
      status: "warn",
      detail: `cannot create a network namespace: ${errorMessage(err).split("\n")[0]}`,
      fix: "apt-get install iproute2 and run as root, for per-child network namespaces",
    };
  }
}

/**
 * Which network mode the daemon of this home runs in and what its host setup looks like (the daemon creates it
 * at start, idempotently: this only reads it).
 */
async function checkSandboxNetwork(paths: ForkdPaths): Promise<DoctorCheck> {
  const name = "sandbox network";
  let config: ReturnType<typeof resolveNetworkConfig>;
  try {
    config = resolveNetworkConfig({}, process.env, paths.home);
  } catch (err) {
    return {
      name,
      status: "fail",
      detail: errorMessage(err),
      fix: "fix FORKD_NET_BRIDGE / FORKD_NET_SUBNET",
    };
  }
  const unavailable = process.getuid?.() !== 0 ? "not running as root" : await privateNetnsUnavailable();
  if (unavailable !== null) {
    return {
      name,
      status: "warn",
      detail: `isolated mode: sandboxes keep their NIC but nothing leaves it (${unavailable})`,
      fix: "run the daemon as root on a kernel with network namespaces and /dev/net/tun, with the launcher built (npm run build), for netns mode",
    };
  }
  const state = await hostNetworkState(config).catch(() => null);
  const upstreams = config.dnsUpstreams.map((u) => `${u.address}:${u.port}`).join(", ") || "none";
  const where = `bridge ${config.bridge} ${config.bridgeAddress}/${config.subnet.prefix} (subnet ${formatCidr(config.subnet)}), DNS forwarder :${config.dnsPort} -> ${upstreams}`;
  if (!state?.bridgeExists) {
    return {
      name,
      status: "ok",
      detail: `netns mode; ${where}: not set up yet (the daemon creates it at start, with IPv4 forwarding and its nftables table)`,
    };
  }
  if (state.owner !== bridgeOwnerTag(paths.home)) {
    return {
      name,
      status: "fail",
      detail: `${config.bridge} exists but belongs to another forkd home (${state.owner ?? "no alias"})`,
      fix: "give this home's daemon its own --net-bridge and --net-subnet",
    };
  }
  const problems = [
    state.up ? null : "bridge down",
    state.ipForward ? null : "net.ipv4.ip_forward is 0",
    state.rulesLoaded ? null : "host rules not loaded",
  ].filter((p): p is string => p !== null);
  return {
    name,
    status: problems.length === 0 ? "ok" : "warn",
    detail: `netns mode; ${where}${problems.length ? `: ${problems.join(", ")}` : ", set up"}`,
    fix: problems.length ? "start (or restart) the daemon: it sets the host up" : undefined,
  };
}

async function checkDisk(paths: ForkdPaths): Promise<DoctorCheck> {
  try {
    await mkdir(paths.home, { recursive: true, mode: 0o700 });
    const fs = await statfs(paths.home);
    const free = fs.bavail * fs.bsize;
    const ok = free >= MIN_FREE_DISK_BYTES;
    return {
      name: "disk",
      status: ok ? "ok" : "warn",
      detail: `${gib(free)} free for ${paths.home}`,
      fix: ok ? undefined : `free at least ${gib(MIN_FREE_DISK_BYTES)} or point FORKD_HOME elsewhere`,
    };
  } catch (err) {
    return {
      name: "disk",
      status: "fail",
      detail: errorMessage(err),
      fix: "set FORKD_HOME to a writable directory",
    };
  }
}

async function checkMemory(): Promise<DoctorCheck> {
  const meminfo = await readFile("/proc/meminfo", "utf8");
  const available = Number(/MemAvailable:\s+(\d+)/.exec(meminfo)?.[1] ?? 0) * 1024;
  const ok = available >= MIN_AVAILABLE_MEMORY_BYTES;
  return {
    name: "memory",
    status: ok ? "ok" : "warn",
    detail: `${gib(available)} available`,
    fix: ok
      ? undefined
      : `children share the parent's RAM, but each costs tens of MiB; free at least ${gib(MIN_AVAILABLE_MEMORY_BYTES)}`,
  };
}

function gib(bytes: number): string {
  return `${(bytes / 1024 ** 3).toFixed(1)} GiB`;
}

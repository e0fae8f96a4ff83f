/** Sandbox networks, egress policies, confinement and limits, ports. Part of the REST API's wire contract (src/api/schemas.ts). */
import { type Static, Type } from "@sinclair/typebox";
import {
  CONSOLE_READ_BYTES,
  MAX_CONSOLE_READ_BYTES,
  MAX_POLICY_ENTRIES,
  SANDBOX_ID_PATTERN,
} from "../../common/limits.js";
import { Nullable } from "./common.js";
import { EgressPolicyOut } from "./snapshots.js";

// Network

export const PolicyEntries = (what: string) =>
  Type.Optional(
    Type.Array(Type.String({ minLength: 1, maxLength: 260 }), {
      maxItems: MAX_POLICY_ENTRIES,
      description: `${what}: IPv4 addresses, CIDR blocks (a.b.c.d/n), domain names, or *.domain wildcards (every name below the domain).`,
    }),
  );

export const EgressPolicyWire = Type.Object(
  {
    egress: Type.Optional(
      Type.Union([Type.Literal("allow"), Type.Literal("deny")], {
        description:
          "What happens to destinations no entry names (default: the daemon's --egress). deny_out containing " +
          "0.0.0.0/0 means deny, as in E2B.",
      }),
    ),
    allow_out: PolicyEntries("Allowed destinations; an allow entry wins over a deny entry"),
    deny_out: PolicyEntries("Denied destinations"),
  },
  {
    additionalProperties: false,
    description:
      "Egress policy (E2B's allowInternetAccess / allowOut / denyOut). Domain entries act through the sandbox's " +
      "DNS: only allowed names resolve, and their answers become reachable for the answer's TTL. Other sandboxes, " +
      "the host and the daemon are never reachable, whatever the policy. See docs/network.md.",
  },
);
export type EgressPolicyWire = Static<typeof EgressPolicyWire>;

export const SandboxNetworkWire = Type.Object(
  {
    kind: Type.Union([Type.Literal("netns"), Type.Literal("private"), Type.Literal("none")], {
      description:
        "netns: its own network namespace with an uplink and an egress policy; private: a NIC with no uplink " +
        '(spawned with network "none", or the daemon runs isolated); none: no NIC (its template has network = "none").',
    }),
    address: Nullable(
      Type.String({
        description: "The namespace's address on the host bridge (what the port proxy connects to).",
      }),
    ),
    egress: Nullable(EgressPolicyOut),
  },
  { description: "A sandbox's network." },
);

export const CgroupVersion = Nullable(Type.Union([Type.Literal("v1"), Type.Literal("v2")]));

export const ConfinementStatusWire = Type.Object(
  {
    mode: Type.Union([Type.Literal("on"), Type.Literal("off")]),
    summary: Type.String(),
    uid_base: Nullable(
      Type.Integer({
        description: "Each QEMU runs as uid = gid = uid_base + its pid; null: as the daemon's user.",
      }),
    ),
    seccomp: Type.Boolean({ description: "QEMU's seccomp sandbox is on." }),
    cgroups: Type.Object(
      { memory: CgroupVersion, cpu: CgroupVersion, pids: CgroupVersion },
      { description: "Where each controller is (null: this host cannot enforce that limit)." },
    ),
    default_disk_limit_mib: Nullable(Type.Integer()),
    console_log_bytes: Type.Integer({
      description: "The console log kept per sandbox (a ring of two halves).",
    }),
  },
  { description: "How this daemon confines its sandboxes' QEMUs." },
);

export const SandboxLimitsWire = Type.Object(
  {
    memory_mib: Nullable(Type.Integer({ description: "memory.max (no swap)." })),
    cpu_millicores: Nullable(Type.Integer({ description: "CPU bandwidth, thousandths of a CPU." })),
    pids: Nullable(Type.Integer({ description: "pids.max: QEMU's processes and threads." })),
    disk_mib: Nullable(Type.Integer({ description: "Largest size of the writable disk layer." })),
  },
  { description: "What the sandbox may use of the host; null = not enforced here." },
);

export const ConsoleQuery = Type.Object(
  {
    bytes: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_CONSOLE_READ_BYTES,
        default: CONSOLE_READ_BYTES,
        description: "How much of the end of the log to return.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const NetworkStatusWire = Type.Object(
  {
    mode: Type.Union([Type.Literal("netns"), Type.Literal("isolated")], {
      description:
        "netns: sandboxes get namespaces with uplinks; isolated: no root/netns here, no egress at all.",
    }),
    reason: Nullable(Type.String({ description: "Why the mode is isolated." })),
    bridge: Nullable(Type.String()),
    subnet: Nullable(Type.String()),
    dns: Nullable(Type.String({ description: "The DNS forwarder (address:port on the bridge)." })),
    dns_upstreams: Type.Array(Type.String()),
    default_egress: Type.Union([Type.Literal("allow"), Type.Literal("deny")]),
  },
  { description: "How this daemon networks its sandboxes." },
);

export const PortParams = Type.Object(
  {
    id: Type.String({ pattern: SANDBOX_ID_PATTERN }),
    port: Type.Integer({ minimum: 1, maximum: 65535 }),
    "*": Type.Optional(Type.String()),
  },
  { additionalProperties: false },
);

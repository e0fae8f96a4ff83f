/**
 * What a node needs to insert another node's paused sandbox (a durable pause, docs/kubernetes.md): its chain
 * (root first, ending with its pause layer), settings, tokens and network. Tags and ids become paths: the
 * cluster node checks each against its pattern before an adopt.
 */
export interface PausedSandboxRecord {
  id: string;
  owner: string | null;
  snapshot_tag: string;
  layer_tags: string[];
  pause_tag: string;
  last_branch_tag: string | null;
  memory_tag: string | null;
  template_alias: string | null;
  accelerator: "kvm" | "tcg";
  live_fork: number;
  created_at_unix: number;
  memory_limit_mib: number | null;
  limits: string;
  metadata: string;
  env_vars: string;
  inbound: string;
  network: "netns" | "private" | "none";
  network_policy: string | null;
  access_token: string | null;
  traffic_token: string | null;
  timeout_ms: number | null;
  on_timeout: "kill" | "pause";
  auto_resume: number;
  auto_pause_memory: number;
  paused_at_unix_ms: number;
}

/**
 * The build-step sandbox: everything of an image build that runs code from a template, a base image or a
 * Dockerfile runs through here, without host root (README.md). Three entry points:
 *
 *   runInImage(run)       a program in an image's own tree (`run`, `pip`, `apt` and `npm` steps)
 *   runHostTool(run)      a host build tool (buildah) over untrusted input, with a minimal host view
 *   openStepNetwork(...)  the network a networked step gets: the configured package indexes only
 *
 * and the id range they run as (`buildIdRange`, `hostId`, `umociIdMap`): trees a step works on are owned by
 * the range's shifted ids on disk, and whoever writes into them from the host (copy and workdir steps) uses
 * `hostId` for the owner.
 */
export { type Credentials, resolveCredentials } from "./credentials.js";
export { type HostToolRun, runHostTool } from "./host-tool.js";
export {
  BUILD_USER,
  type BuildIdRange,
  buildIdentityStatus,
  buildIdRange,
  ensureBuildIdentity,
  hostId,
  umociIdMap,
} from "./identity.js";
export { BUILD_HOSTNAME, runInImage, SANDBOX_INPUTS, type SandboxRun } from "./image-step.js";
export {
  assertConfiguredIndex,
  describeIndexes,
  hostPackageIndexes,
  type IndexEndpoint,
  indexEndpoints,
  type PackageIndex,
} from "./indexes.js";
export { openStepNetwork, type StepNetwork } from "./network.js";
export {
  assertReachableByBuildRange,
  giveAllToBuildRange,
  giveToBuildRange,
  openToBuildRange,
  takeFromBuildRange,
} from "./ownership.js";

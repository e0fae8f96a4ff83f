/** Public API of the image layer: templates, guest image builds and the image cache. */

export type { BuildOptions, BuildProgressEvent, BuildStep, ImageOptions, ResolvedRecipe } from "./build.js";
export { buildImage, findCachedImage, readImage, resolveRecipe } from "./build.js";
export type { BuiltImage, ImageManifest } from "./cache.js";
export {
  createStaging,
  IMAGE_FILES,
  imageOfFiles,
  importedImagesDir,
  readImageDir,
  removeStaging,
  sweepStaleStaging,
} from "./cache.js";
export {
  isLoopbackRegistry,
  ociLayoutName,
  registryTlsVerify,
  skopeoCopy,
  skopeoDelete,
  skopeoInspectRaw,
} from "./containers.js";
export {
  GUEST_AGENT_COMMAND,
  INIT_FAILED_MARKER,
  KERNEL_CMDLINE,
  PROBE_MARKER,
  ROOT_MOUNT_FAILED_MARKER,
} from "./initramfs.js";
export { blobPath, OCI_MANIFEST, REF_NAME_ANNOTATION, resolveImage } from "./oci-layout.js";
export type { ImageTemplate, Recipe } from "./recipe.js";
export { BUILDER_VERSION } from "./recipe.js";
export type {
  ImageSource,
  Interpreter,
  ReadyCheck,
  Template,
  TemplateCommand,
  TemplateEgress,
  TemplateFile,
  TemplateStep,
} from "./template.js";
export {
  listTemplateEntries,
  listTemplateNames,
  listTemplates,
  loadTemplate,
  parseTemplate,
  TEMPLATE_DEFAULTS,
} from "./template.js";
export { IMAGE_REFERENCE } from "./template-v2.js";

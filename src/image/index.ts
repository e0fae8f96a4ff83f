/** Public API of the image layer: templates, guest image builds and the image cache. */

export type { BuildOptions, BuildProgressEvent, BuildStep, ImageOptions, ResolvedRecipe } from "./build.js";
export { buildImage, findCachedImage, readImage, resolveRecipe } from "./build.js";
export type { BuiltImage, ImageManifest } from "./cache.js";
export { IMAGE_FILES } from "./cache.js";
export {
  GUEST_AGENT_COMMAND,
  INIT_FAILED_MARKER,
  KERNEL_CMDLINE,
  PROBE_MARKER,
  ROOT_MOUNT_FAILED_MARKER,
} from "./initramfs.js";
export type { ImageTemplate, Recipe } from "./recipe.js";
export { BUILDER_VERSION } from "./recipe.js";
export type {
  ImageSource,
  Interpreter,
  ReadyCheck,
  Template,
  TemplateCommand,
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

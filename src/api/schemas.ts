/**
 * The REST API's wire contract, declared once: these TypeBox schemas validate every request (src/api/validation.ts)
 * and generate the OpenAPI document (docs/openapi.json). Field names are snake_case and follow forkd v0.5 where
 * the route existed there (see docs/api.md, "Compatibility").
 */
export * from "./schemas/common.js";
export * from "./schemas/exec-stream.js";
export * from "./schemas/files.js";
export * from "./schemas/guest-calls.js";
export * from "./schemas/network.js";
export * from "./schemas/sandboxes.js";
export * from "./schemas/snapshots.js";
export * from "./schemas/workspaces.js";

/** Guest files. Part of the REST API's wire contract (src/api/schemas.ts). */
import { type Static, Type } from "@sinclair/typebox";
import { FILE_MODE_PATTERN, MAX_PATH_CHARS } from "../../common/limits.js";
import { Nullable } from "./common.js";

// Files

export const GuestPath = Type.String({
  minLength: 1,
  maxLength: MAX_PATH_CHARS,
  description: "Absolute path inside the sandbox; no '..' segments, no NUL.",
});

export const FileQuery = Type.Object({ path: GuestPath }, { additionalProperties: false });
export const PutFileQuery = Type.Object(
  {
    path: GuestPath,
    mode: Type.Optional(Type.String({ pattern: FILE_MODE_PATTERN, description: "Octal permission bits." })),
  },
  { additionalProperties: false },
);
export const RemoveFileQuery = Type.Object(
  { path: GuestPath, recursive: Type.Optional(Type.Boolean()) },
  { additionalProperties: false },
);

export const FileInfoWire = Type.Object({
  name: Type.String(),
  type: Type.Union([
    Type.Literal("file"),
    Type.Literal("dir"),
    Type.Literal("symlink"),
    Type.Literal("other"),
  ]),
  size: Type.Integer(),
  mode: Type.Integer({ description: "Permission bits." }),
  mtime_ms: Type.Number(),
  link_target: Nullable(Type.String()),
});
export type FileInfoWire = Static<typeof FileInfoWire>;

export const FileListingWire = Type.Object({
  path: Type.String(),
  entries: Type.Array(FileInfoWire),
  truncated: Type.Boolean(),
});
export const PutFileResponse = Type.Object({ path: Type.String(), bytes: Type.Integer() });

/** Marker for octet-stream bodies: documented in OpenAPI, not validated (src/api/validation.ts skips it). */
export const BinaryBody = Type.Unsafe<Buffer>({ type: "string", format: "binary" });

// ---------------------------------------------------------------------------------------------------------------

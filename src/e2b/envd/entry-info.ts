/** The agent's FileInfo as envd's EntryInfo (filesystem.proto). */
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { FileInfo } from "../../agent/host/types.js";
import { type EntryInfo, EntryInfoSchema, FileType } from "./gen/filesystem/filesystem_pb.js";

const FILE_TYPES: Record<FileInfo["type"], FileType> = {
  file: FileType.FILE,
  dir: FileType.DIRECTORY,
  symlink: FileType.SYMLINK,
  other: FileType.UNSPECIFIED,
};

/** The mode as Go's FileMode.String() writes it (envd's `permissions`): type letter, then rwx for each class. */
export function permissionString(type: FileInfo["type"], mode: number): string {
  const kind = { file: "-", dir: "d", symlink: "L", other: "?" }[type];
  const bits = "rwxrwxrwx";
  let out = kind;
  for (let i = 0; i < 9; i++) out += mode & (1 << (8 - i)) ? bits[i] : "-";
  return out;
}

export function entryInfo(info: FileInfo, fallbackPath: string): EntryInfo {
  return create(EntryInfoSchema, {
    name: info.name,
    type: FILE_TYPES[info.type],
    path: info.path ?? fallbackPath,
    size: BigInt(info.size),
    mode: info.mode,
    permissions: permissionString(info.type, info.mode),
    owner: info.owner ?? (info.uid === undefined ? "" : String(info.uid)),
    group: info.group ?? (info.gid === undefined ? "" : String(info.gid)),
    modifiedTime: timestampFromMs(Math.floor(info.mtimeMs)),
    ...(info.linkTarget !== undefined ? { symlinkTarget: info.linkTarget } : {}),
  });
}

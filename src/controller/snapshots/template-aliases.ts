/**
 * Template names: an alias names a snapshot tag (persisted in SQLite), so a caller can say `my-agent:v2` or an
 * E2B template name and get a snapshot. Aliases never become paths; tags do, and are validated as such.
 */
import { invalidArgument, notFound } from "../../common/errors.js";
import { TEMPLATE_ALIAS_PATTERN } from "../../common/limits.js";
import { isValidTag, unanchored } from "../../common/names.js";
import type { StateDb } from "../../store/db.js";
import type { SnapshotStore } from "../../store/snapshot-store.js";

/** Letters, digits and `._:/-`, starting with a letter or digit: E2B names such as `team/name:tag` fit. */
const ALIAS = new RegExp(TEMPLATE_ALIAS_PATTERN);

/** The template snapshot used when a caller asks for "the default" and the daemon was not told otherwise. */
export const FALLBACK_DEFAULT_SNAPSHOT = "pyagent";

export interface TemplateAlias {
  alias: string;
  tag: string;
  created_at_unix: number;
  /** The tenant that set it (tenancy/tenant-view.ts); null: an admin's. */
  owner: string | null;
}

export interface ResolvedTemplate {
  tag: string;
  /** The alias the name was, or null when it named the tag itself. */
  alias: string | null;
}

export function assertAlias(alias: unknown): string {
  if (typeof alias !== "string" || !ALIAS.test(alias)) {
    throw invalidArgument(
      `invalid template alias ${JSON.stringify(alias)}: must match ${unanchored(TEMPLATE_ALIAS_PATTERN)}`,
    );
  }
  return alias;
}

export class TemplateAliases {
  constructor(
    private readonly db: StateDb,
    private readonly store: SnapshotStore,
    /** The daemon's configured default snapshot (`--default-snapshot`); absent = pyagent when present. */
    private readonly configuredDefault?: string,
  ) {}

  list(): TemplateAlias[] {
    return this.db.aliases();
  }

  get(alias: string): TemplateAlias {
    const row = this.db.alias(assertAlias(alias));
    if (!row) throw notFound(`template alias ${JSON.stringify(alias)} not found`);
    return row;
  }

  /**
   * Points `alias` at `tag` (replacing what it named before); not_found if the snapshot does not exist. An
   * existing alias keeps its owner unless `owner` is given.
   */
  async set(alias: string, tag: string, owner?: string | null): Promise<TemplateAlias> {
    assertAlias(alias);
    if (!isValidTag(tag) || !(await this.store.exists(tag))) {
      throw notFound(`snapshot ${JSON.stringify(tag)} not found`);
    }
    const row = {
      alias,
      tag,
      created_at_unix: Math.floor(Date.now() / 1000),
      owner: owner === undefined ? (this.db.alias(alias)?.owner ?? null) : owner,
    };
    this.db.setAlias(row);
    return row;
  }

  delete(alias: string): void {
    if (!this.db.deleteAlias(assertAlias(alias))) {
      throw notFound(`template alias ${JSON.stringify(alias)} not found`);
    }
  }

  /** Aliases naming `tag`. */
  namesOf(tag: string): string[] {
    return this.db
      .aliases()
      .filter((a) => a.tag === tag)
      .map((a) => a.alias);
  }

  /**
   * An alias first, then a snapshot tag; with `orDefault`, a name that is neither resolves to the default
   * snapshot (the caller asked for a well-known default template name). not_found otherwise.
   */
  async resolve(name: string, options: { orDefault?: boolean } = {}): Promise<ResolvedTemplate> {
    assertAlias(name);
    const row = this.db.alias(name);
    if (row) return { tag: row.tag, alias: name };
    if (isValidTag(name) && (await this.store.exists(name))) return { tag: name, alias: null };
    if (options.orDefault) {
      const tag = await this.defaultTag();
      if (tag !== null) return { tag, alias: name };
      throw notFound(
        `template ${JSON.stringify(name)} not found: it means the daemon's default snapshot, and there is none ` +
          `(create one with \`forkd snapshot --tag ${FALLBACK_DEFAULT_SNAPSHOT}\` or start the daemon with --default-snapshot)`,
      );
    }
    throw notFound(`template ${JSON.stringify(name)} not found (no alias or snapshot of that name)`);
  }

  /** The configured default snapshot, or pyagent when it exists; null when there is none. */
  async defaultTag(): Promise<string | null> {
    const tag = this.configuredDefault ?? FALLBACK_DEFAULT_SNAPSHOT;
    return (await this.store.exists(tag)) ? tag : null;
  }
}

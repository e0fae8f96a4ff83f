/** Compiled typebox validators whose failures name the offending field. */
import type { Static, TSchema } from "@sinclair/typebox";
import { type TypeCheck, TypeCompiler } from "@sinclair/typebox/compiler";
import { invalidArgument } from "../../common/errors.js";

export interface Validator<T extends TSchema> {
  /** Returns `value` typed, or throws `invalid_argument` naming `what` and the first failing field. */
  assert(value: unknown, what: string): Static<T>;
  check(value: unknown): value is Static<T>;
  /** Compiles now instead of on first use (the guest does this before its parent VM is snapshotted). */
  compile(): void;
}

/** Compiles on first use, so importing the protocol costs nothing until a message is actually checked. */
export function validator<T extends TSchema>(schema: T): Validator<T> {
  let compiled: TypeCheck<T> | undefined;
  const get = () => {
    compiled ??= TypeCompiler.Compile(schema);
    return compiled;
  };
  return {
    compile: () => {
      get();
    },
    check: (value): value is Static<T> => get().Check(value),
    assert(value, what) {
      const check = get();
      if (check.Check(value)) return value;
      const first = check.Errors(value).First();
      const where = first?.path ? first.path : "(root)";
      const expected = first?.schema.description ? ` (expected ${first.schema.description})` : "";
      throw invalidArgument(
        `invalid ${what}: ${where}: ${first?.message ?? "does not match the schema"}${expected}`,
      );
    },
  };
}

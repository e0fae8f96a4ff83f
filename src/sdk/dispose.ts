/**
 * `await using sandbox = await Sandbox.create(...)` needs Symbol.asyncDispose, which Node 20 only defines from
 * 20.4 on (as Symbol.for("nodejs.asyncDispose")). Importing the SDK defines it, with that same registered
 * symbol, only where it is missing, so objects from Node's own streams and from other polyfills keep working.
 */
if (typeof Symbol.asyncDispose !== "symbol") {
  Object.defineProperty(Symbol, "asyncDispose", {
    value: Symbol.for("nodejs.asyncDispose"),
    writable: false,
    enumerable: false,
    configurable: false,
  });
}

export const asyncDispose: typeof Symbol.asyncDispose = Symbol.asyncDispose;

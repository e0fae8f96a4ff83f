/**
 * `await using sandbox = await Sandbox.create(...)` needs Symbol.asyncDispose, which Node 20 only defines from
 * 20.4 on (as Symbol.for("nodejs.asyncDispose")). Importing the SDK defines it, with that same registered
 * symbol, only where it is missing, so objects from Node's own streams and from other polyfills keep working.
 */

/** Defines `asyncDispose` on `symbolConstructor` if absent, like the built-in (read-only, hidden). */
export function installAsyncDisposeSymbol(symbolConstructor: SymbolConstructor = Symbol): symbol {
  if (typeof symbolConstructor.asyncDispose !== "symbol") {
    Object.defineProperty(symbolConstructor, "asyncDispose", {
      value: symbolConstructor.for("nodejs.asyncDispose"),
      writable: false,
      enumerable: false,
      configurable: false,
    });
  }
  return symbolConstructor.asyncDispose;
}

installAsyncDisposeSymbol();

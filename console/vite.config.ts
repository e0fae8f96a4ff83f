// Builds the console's page into dist/console (served by the daemon at /console/). Everything the page needs is
// bundled here at build time: no CDN, nothing fetched from elsewhere at runtime.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "/console/",
  // No public/ directory: every file the page uses is imported, hashed and bundled.
  publicDir: false,
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: {
    outDir: fileURLToPath(new URL("../dist/console", import.meta.url)),
    emptyOutDir: true,
    target: "es2022",
    sourcemap: true,
    // One small page: a warning for the whole bundle (xterm.js is most of it) would be noise.
    chunkSizeWarningLimit: 1024,
  },
  logLevel: "warn",
});

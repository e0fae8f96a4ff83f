#!/usr/bin/env node
// forkd v0.5's MCP server command, kept so MCP client configurations written for it (`"command": "forkd-mcp"`,
// FORKD_URL / FORKD_TOKEN in "env") work unchanged: the same as `forkd mcp` (stdio).
process.argv.splice(2, 0, "mcp");
await import("../dist/src/cli/main.js");

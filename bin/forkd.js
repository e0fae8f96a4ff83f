#!/usr/bin/env node
// The forkd CLI, compiled from src/cli/main.ts by `npm run build`.
import "../dist/src/cli/main.js";

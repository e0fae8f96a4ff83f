/** The agent protocol shared by the host client and the guest agent. */
export * from "./frame.js";
export * from "./limits.js";
export * from "./messages.js";
export * from "./ops.js";
export * from "./validate.js";

/** Version of the guest agent program; reported in hello and ping next to the protocol version. */
export const AGENT_VERSION = "0.1.0";

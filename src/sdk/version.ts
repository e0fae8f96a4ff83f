/** The SDK's version, sent as the user agent so the daemon's logs say which client called. */
export const SDK_VERSION = "0.1.0";

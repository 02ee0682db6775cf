/**
 * The package version this client announces in its hello. It must equal
 * `version` in sdk-ts/package.json (a unit test checks it) and the server's
 * crate version: the server refuses another version.
 */
export const PACKAGE_VERSION = "0.1.0";

/** The client.v1 protocol version this client speaks. */
export const PROTOCOL_VERSION = 1;

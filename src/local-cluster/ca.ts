/**
 * A throwaway certificate authority (for the tests' and the local cluster's control plane) and the certificates it signs, made with openssl (Node's
 * crypto makes keys but not X.509 certificates). Keys are EC P-256; everything lives in `dir` (mode 0700, the
 * caller's) and is valid for two days.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

export interface CertificateFiles {
  cert: string;
  key: string;
}

export interface LeafRequest {
  /** The file name stem in the CA's directory. */
  name: string;
  /** The subject, e.g. "/O=system:masters/CN=admin" (Kubernetes reads O as groups and CN as the user). */
  subject: string;
  /** What it may be used for: serving (also a client of peers), or only a client. */
  usage: "server" | "client";
  /** Subject alternative names of a serving certificate, e.g. ["IP:127.0.0.1", "DNS:localhost"]. */
  altNames?: string[];
}

export interface TestCa extends CertificateFiles {
  dir: string;
  issue(request: LeafRequest): Promise<CertificateFiles>;
}

const EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/** openssl's configuration: our own, so the machine's defaults add no extension we did not ask for. */
function opensslConfig(altNames: string[]): string {
  return [
    "[req]",
    "distinguished_name = dn",
    "[dn]",
    "[ca_ext]",
    "basicConstraints = critical,CA:TRUE",
    "keyUsage = critical,keyCertSign,cRLSign",
    "subjectKeyIdentifier = hash",
    "[server_ext]",
    "basicConstraints = critical,CA:FALSE",
    "keyUsage = critical,digitalSignature,keyEncipherment",
    "extendedKeyUsage = serverAuth,clientAuth",
    "authorityKeyIdentifier = keyid",
    ...(altNames.length > 0 ? [`subjectAltName = ${altNames.join(",")}`] : []),
    "[client_ext]",
    "basicConstraints = critical,CA:FALSE",
    "keyUsage = critical,digitalSignature",
    "extendedKeyUsage = clientAuth",
    "authorityKeyIdentifier = keyid",
    "",
  ].join("\n");
}

/** Makes a CA in `dir` (ca.crt, ca.key). */
export async function createTestCa(dir: string, commonName = "forkd-test-ca"): Promise<TestCa> {
  const ca = { cert: path.join(dir, "ca.crt"), key: path.join(dir, "ca.key") };
  const config = path.join(dir, "openssl-ca.cnf");
  await writeFile(config, opensslConfig([]), { mode: 0o600 });
  await run("openssl", [
    ...["req", "-x509", "-config", config, "-extensions", "ca_ext", ...EC_KEY],
    ...["-keyout", ca.key, "-out", ca.cert, "-days", "2", "-subj", `/CN=${commonName}`],
  ]);
  return { ...ca, dir, issue: (request) => issue(dir, ca, request) };
}

async function issue(dir: string, ca: CertificateFiles, request: LeafRequest): Promise<CertificateFiles> {
  const leaf = { cert: path.join(dir, `${request.name}.crt`), key: path.join(dir, `${request.name}.key`) };
  const csr = path.join(dir, `${request.name}.csr`);
  const config = path.join(dir, `openssl-${request.name}.cnf`);
  await writeFile(config, opensslConfig(request.altNames ?? []), { mode: 0o600 });
  await run("openssl", [
    ...["req", "-new", "-config", config, ...EC_KEY, "-keyout", leaf.key, "-out", csr],
    ...["-subj", request.subject],
  ]);
  await run("openssl", [
    ...["x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-days", "2"],
    ...["-set_serial", `0x${randomBytes(16).toString("hex")}`, "-out", leaf.cert],
    ...["-extfile", config, "-extensions", `${request.usage}_ext`],
  ]);
  return leaf;
}

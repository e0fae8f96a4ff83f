/** IPv4 addresses and CIDR blocks, parsed and compared with ipaddr.js (strict dotted-quad only). */
import ipaddr from "ipaddr.js";

export interface Cidr {
  /** Network address, host bits cleared. */
  address: string;
  prefix: number;
}

/** True for a strict dotted quad ("10.0.0.1"; not "10.1", "0x0a.0.0.1" or "010.0.0.1"). */
export function isIPv4(text: string): boolean {
  return ipaddr.IPv4.isValidFourPartDecimal(text);
}

/** "10.1.2.3/8" -> {address: "10.0.0.0", prefix: 8}; a bare address is a /32. Null when it is not IPv4. */
export function parseCidr(text: string): Cidr | null {
  const [addr, prefixText, ...rest] = text.split("/");
  if (addr === undefined || rest.length > 0 || !isIPv4(addr)) return null;
  if (prefixText !== undefined && !/^(\d|[12]\d|3[0-2])$/.test(prefixText)) return null;
  const prefix = prefixText === undefined ? 32 : Number(prefixText);
  const network = ipaddr.IPv4.networkAddressFromCIDR(`${addr}/${prefix}`).toString();
  return { address: network, prefix };
}

export function formatCidr(cidr: Cidr): string {
  return cidr.prefix === 32 ? cidr.address : `${cidr.address}/${cidr.prefix}`;
}

export function toUint32(address: string): number {
  return ipaddr.IPv4.parse(address).octets.reduce((n, octet) => n * 256 + octet, 0);
}

export function fromUint32(n: number): string {
  return [24, 16, 8, 0].map((shift) => Math.floor(n / 2 ** shift) % 256).join(".");
}

export function cidrContains(cidr: Cidr, address: string): boolean {
  return ipaddr.IPv4.parse(address).match(ipaddr.IPv4.parse(cidr.address), cidr.prefix);
}

export function cidrsOverlap(a: Cidr, b: Cidr): boolean {
  return cidrContains(a, b.address) || cidrContains(b, a.address);
}

/** Number of addresses in the block (2^(32-prefix)). */
export function cidrSize(cidr: Cidr): number {
  return 2 ** (32 - cidr.prefix);
}

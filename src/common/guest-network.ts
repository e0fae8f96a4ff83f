/**
 * The guest's side of every sandbox network, identical in every VM: the parent is booted with it and every
 * child restored from the parent keeps it (it is in the snapshot). Children are told apart on the host side
 * (each has its own network namespace and address), never on the guest side. The gateway is the tap inside
 * each sandbox's namespace; it has the same address and MAC everywhere, so a restored child's neighbour entry
 * for it stays valid.
 *
 * Shared by the image (the boot /init configures it), vmm (the NIC's MAC) and net (the namespace side).
 */

/** The guest's interface as the guest kernel names it (no udev in the initramfs: the first NIC is eth0). */
export const GUEST_IFNAME = "eth0";
export const GUEST_IP = "10.42.0.2";
export const GATEWAY_IP = "10.42.0.1";
export const GUEST_PREFIX_LENGTH = 24;
/** Locally administered unicast MACs (second-lowest bit of the first octet set, lowest clear). */
export const GUEST_MAC = "02:fd:00:00:00:02";
export const GATEWAY_MAC = "02:fd:00:00:00:01";
/** The guest's resolver: the gateway, port 53 (forwarded by the namespace to the daemon's DNS forwarder). */
export const GUEST_NAMESERVER = GATEWAY_IP;

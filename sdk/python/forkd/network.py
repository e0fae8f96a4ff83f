"""Egress policies as the daemon takes them (docs/network.md): which destinations a sandbox may reach.

Shapes are checked here so a typo fails before any request; the entries themselves (addresses, CIDR blocks,
domain names, ``*.domain``) are checked by the daemon, whose 400 names the entry.
"""

from typing import Any, Dict, Mapping, Optional, Sequence, Union

from .errors import InvalidArgumentError

#: An egress policy mapping (``egress``, ``allow_out``, ``deny_out``; any may be left out), or ``"none"``.
NetworkRequest = Union[str, Mapping[str, Any]]

POLICY_FIELDS = ("egress", "allow_out", "deny_out")


def policy(
    egress: Optional[str] = None,
    allow_out: Optional[Sequence[str]] = None,
    deny_out: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """A policy mapping with only the fields given (the rest come from the template's or daemon's default)."""
    given = {"egress": egress, "allow_out": allow_out, "deny_out": deny_out}
    return {name: value for name, value in given.items() if value is not None}


def network_to_wire(network: NetworkRequest) -> Union[str, Dict[str, Any]]:
    """The request's ``network`` field: ``"none"`` or a checked policy."""
    if network == "none":
        return "none"
    if isinstance(network, str) or not isinstance(network, Mapping):
        raise InvalidArgumentError('network must be "none" or a mapping with egress, allow_out, deny_out')
    unknown = sorted(set(network) - set(POLICY_FIELDS))
    if unknown:
        allowed = ", ".join(POLICY_FIELDS)
        raise InvalidArgumentError(f"network: unknown field(s) {', '.join(unknown)} (allowed: {allowed})")
    wire: Dict[str, Any] = {}
    egress = network.get("egress")
    if egress is not None:
        if egress not in ("allow", "deny"):
            raise InvalidArgumentError(f'network.egress must be "allow" or "deny", got {egress!r}')
        wire["egress"] = egress
    for field in ("allow_out", "deny_out"):
        entries = network.get(field)
        if entries is None:
            continue
        if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
            raise InvalidArgumentError(f"network.{field} must be a list of strings")
        wire[field] = list(entries)
    return wire

"""Splitting and joining ``host:port`` addresses (IPv6 hosts go in brackets: ``[::1]:2222``)."""

from __future__ import annotations

import ipaddress
import re

from tfdist.cluster._error import config_error, show
from tfdist.cluster.counts import is_whole_number, parse_count

__all__ = ["split_address", "join_address", "split_host_count", "check_host", "is_whole_number"]

MAX_PORT = 65535
# A DNS name (RFC 1123 labels; '_' too, which container runtimes use) or an IPv4 address. A host
# reaches ssh and remote shells, so nothing a shell would read as syntax may pass.
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?")


def check_host(
    host: str, field: str, where: str, *, example: str = "node01", received: str | None = None
) -> str:
    """Returns ``host`` if it can name a machine, else raises `ClusterConfigError`.

    Refused: an empty host; one that starts with ``-``, which ssh would read as an option
    (``-oProxyCommand=...`` runs a command); one with whitespace or a control or format
    character (such as a byte-order mark); anything else that is neither a DNS name, an IPv4
    address nor an IPv6 address (``n1;touch x``, ``$(id)``: shell syntax that would reach ssh).

    Args:
        host: The host, without port or brackets.
        field: Where it was found, for the message (e.g. ``"cluster.worker[1]"``).
        where: What was being read (e.g. ``"host list"``).
        example: A valid entry of the same form, for the message.
        received: How to show what was read (default: the host).

    Example:
        >>> check_host("node01", "hosts[0]", "host list")
        'node01'
    """
    if not host:
        problem = f"{field} has an empty host."
    elif host.startswith("-"):
        problem = f"{field} has a host that starts with '-' (ssh would read it as an option)."
    elif any(char.isspace() or not char.isprintable() for char in host):
        problem = f"{field} has a host with whitespace or a control character."
    elif not _is_host_name(host):
        problem = (f"{field} has a host that is not a hostname or IP address (only letters, "
                   "digits, '.', '-' and '_'; IPv6 in brackets).")
    else:
        return host
    raise config_error(
        where, problem, received=show(host) if received is None else received,
        expected=f"a hostname or IP address as in {example!r}",
        fix="Write the machine's hostname or IP address, without spaces, shell characters or "
        "a leading '-'.",
    )


def _is_host_name(host: str) -> bool:
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return False
        return True
    return _HOSTNAME.fullmatch(host) is not None and ".." not in host


def join_address(host: str, port: int) -> str:
    """Joins a host and a port, bracketing IPv6 hosts.

    Example:
        >>> join_address("node01", 2222), join_address("::1", 2222)
        ('node01:2222', '[::1]:2222')
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split(text: str, field: str, where: str, what: str) -> tuple[str, str | None]:
    """Splits ``host[:suffix]`` into host and suffix (None when absent). Rejects bad hosts."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise config_error(
                where, f"{field} has an unclosed or misplaced ']'.", received=show(text),
                expected=f"[ipv6]:{what} such as '[::1]:2222'", fix="Close the bracket before ':'.",
            )
        suffix = rest[1:] if rest else None
    else:
        host, colon, suffix_text = text.rpartition(":")
        host, suffix = (host, suffix_text) if colon else (suffix_text, None)
        if ":" in host:
            raise config_error(
                where, f"{field} looks like an IPv6 address without brackets.", received=show(text),
                expected=f"[ipv6]:{what}", fix="Put IPv6 hosts in brackets, e.g. '[::1]:2222'.",
            )
    example = f"node01:{'2222' if what == 'port' else '2'}"
    check_host(host, field, where, example=example, received=show(text))
    return host, suffix


def split_address(
    address: object, field: str = "address", where: str = "cluster spec"
) -> tuple[str, int]:
    """Splits ``"host:port"`` into ``(host, port)``, raising `ClusterConfigError` when invalid.

    Args:
        address: The address to check.
        field: Where it was found, for the message (e.g. ``"cluster.worker[1]"``).
        where: What was being read (e.g. ``"TF_CONFIG"``).

    Example:
        >>> split_address("node01:2222"), split_address("[::1]:2223")
        (('node01', 2222), ('::1', 2223))
    """
    if not isinstance(address, str):
        raise config_error(
            where, f"{field} is not a string.", received=show(address),
            expected="a 'host:port' string", fix="Quote the address, e.g. 'node01:2222'.",
        )
    host, port = _split(address, field, where, "port")
    if port is None or port == "":
        raise config_error(
            where, f"{field} has no port.", received=show(address),
            expected="'host:port' such as 'node01:2222'", fix=f"Append a port: '{address}:2222'.",
        )
    if not is_whole_number(port) or not 1 <= int(port) <= MAX_PORT:
        raise config_error(
            where, f"{field} has an invalid port {port!r}.", received=show(address),
            expected=f"a port number in 1..{MAX_PORT}", fix="Use a free port such as 2222.",
        )
    return host, int(port)


def split_host_count(entry: str, field: str, where: str) -> tuple[str, int]:
    """Splits a ``"host:slots"`` entry (bare ``"host"`` means 1 slot).

    Example:
        >>> split_host_count("h1:2", "hosts[0]", "host list"), split_host_count("[::1]", "x", "y")
        (('h1', 2), ('::1', 1))
    """
    host, count = _split(entry.strip(), field, where, "slots")
    if count is None:
        return host, 1
    slots = parse_count(
        count, f"the slot count of {field}", where, fix=f"Write {join_address(host, 1)!r}.",
        received=show(entry),
    )
    return host, slots

"""Where a webhook may send: a public http(s) URL, unless the node allows more.

Rule 1: the host is resolved and EVERY address it resolves to is checked: one loopback,
link-local, private, reserved or multicast address refuses the URL (a name with a public and a
private address would otherwise reach the private one on some attempts). IPv4 addresses mapped
into IPv6 are checked as the IPv4 address they are.
Rule 2: the check runs at registration (a clear 400) and again at every attempt, inside the
HTTP client's resolver (``CheckedResolver``): the connection goes only to addresses that passed,
so a name re-pointed at a private address after registration (DNS rebinding) is refused too.
Rule 3: ``allow_private`` (``--webhooks-allow-private``) lets every address through;
``allow_loopback`` only 127.0.0.0/8 and ::1 (``conveyor dev``: a receiver on the same machine).
Rule 4: no user or password in the URL: they would be stored and shown in listings; a
receiver authenticates the node by the signature.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from conveyor.errors import ContractError
from conveyor.frozen import frozen

URL_CHARS_MAX = 2_048


@frozen
class AddressPolicy:
    allow_private: bool = False
    allow_loopback: bool = False

    def refusal(self, address: str) -> str | None:
        """Why ``address`` may not be sent to, or None if it may (rules 1 and 3)."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if self.allow_private:
            return None
        if ip.is_loopback:
            return None if self.allow_loopback else f"{ip} is a loopback address"
        if ip.is_link_local:
            return f"{ip} is a link-local address"
        if ip.is_private or ip.is_reserved or ip.is_multicast or ip.is_unspecified:
            return f"{ip} is a private or reserved address"
        if not ip.is_global:
            return f"{ip} is not a public address"
        return None


def _invalid(url: str, why: str) -> ContractError:
    return ContractError(f"url: {why} (got {url[:200]!r})", field="url")


def parse_url(url: object) -> tuple[str, str, int]:
    """``(url, host, port)`` of a webhook URL, or a ContractError saying what is wrong."""
    if not isinstance(url, str) or not url:
        raise ContractError("url: required, an http or https URL", field="url")
    if len(url) > URL_CHARS_MAX:
        raise _invalid(url, f"over {URL_CHARS_MAX} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _invalid(url, f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise _invalid(url, "must be an http or https URL")
    if parts.username is not None or parts.password is not None:
        raise _invalid(url, "must not carry a user or password; receivers check the signature")
    if not parts.hostname:
        raise _invalid(url, "has no host")
    if parts.fragment:
        raise _invalid(url, "must not have a #fragment")
    return url, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def literal_refusal(host: str, policy: AddressPolicy) -> str | None:
    """Why an IP-literal host may not be sent to (aiohttp does not resolve those, so the
    resolver never sees them); None if it may, or if ``host`` is a name."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return policy.refusal(host)


async def check_url(url: object, policy: AddressPolicy) -> str:
    """The URL if every address its host resolves to may be sent to (rules 1 and 3)."""
    url, host, port = parse_url(url)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _invalid(url, f"its host {host!r} does not resolve: {exc.strerror or exc}") from None
    for info in infos:
        why = policy.refusal(str(info[4][0]))
        if why is not None:
            raise _invalid(
                url,
                f"its host {host!r} resolves to {why}; a node sends webhooks to public "
                "addresses only unless started with --webhooks-allow-private",
            )
    return url


class AddressRefused(OSError):
    """An attempt's host resolved to an address the policy refuses (rule 2)."""


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a host with any address the policy refuses (rule 2)."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            why = self._policy.refusal(result["host"])
            if why is not None:
                raise AddressRefused(f"{host} resolves to {why}")
        return results

    async def close(self) -> None:
        await self._inner.close()

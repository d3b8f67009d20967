"""Which browser origins and Host names may change state: the allow-list behind the
cross-site and DNS-rebinding defences (server/security.py applies it).

A browser always sends `Origin` on WebSocket handshakes and on non-GET requests; a request
without one is not from a web page (curl, the Python client) and is not judged here.

- Trusted hosts: loopback names (`localhost`, `*.localhost`, 127.0.0.0/8, `::1`), the
  configured `host` (unless it is a wildcard), IP literals (a DNS-rebinding page is always
  served under a *name*), and the `allowed_hosts` setting (`*` = any).
- An origin is allowed when it is listed in `cors_origins` (`*` = any), when its host is a
  loopback name, or when it is the server's own origin (same scheme-less netloc as `Host`) —
  without API keys only if `Host` is trusted, since a rebinding page is "same-origin" with
  the attacker's name. With API keys a page cannot authenticate without a key, so the plain
  same-origin rule stays.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .settings import Settings

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}  # noqa: S104  (names of "any address")


def hostname(netloc: str) -> str:
    """`Host` / netloc without port and brackets, lower case (`"[::1]:80"` -> `"::1"`)."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0]
    if netloc.count(":") == 1:
        return netloc.split(":", 1)[0]
    return netloc  # (a bare IPv6 address or a name without port)


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback(name: str) -> bool:
    ip = _ip(name)
    if ip is not None:
        return ip.is_loopback
    return name in LOOPBACK_NAMES or name.endswith(".localhost")


@dataclass
class OriginPolicy:
    cors: set[str] = field(default_factory=set)  # allowed origins, without trailing "/"
    hosts: set[str] = field(default_factory=set)  # extra trusted host names
    any_host: bool = False
    keys: bool = False  # API keys are required

    @classmethod
    def of(cls, settings: Settings) -> OriginPolicy:
        hosts = {hostname(h) for h in settings.allowed_host_list()}
        if settings.host.lower() not in WILDCARD_HOSTS:
            hosts.add(hostname(settings.host))
        return cls(
            cors=set(settings.origin_list()),
            hosts=hosts - {"*"},
            any_host="*" in settings.allowed_host_list(),
            keys=bool(settings.key_list()),
        )

    def host_trusted(self, host: str) -> bool:
        name = hostname(host)
        if not name:
            return False
        return self.any_host or name in self.hosts or is_loopback(name) or _ip(name) is not None

    def origin_ok(self, origin: str | None, host: str) -> bool:
        """May a page of `origin` use this server (reached as `host`)? No origin: yes."""
        if origin is None:
            return True
        origin = origin.strip().rstrip("/")
        if "*" in self.cors or origin in self.cors:
            return True
        netloc = urlsplit(origin).netloc.lower()
        if not netloc:  # ("null" and other opaque origins)
            return False
        if is_loopback(hostname(netloc)):
            return True
        same = netloc == host.strip().lower() != ""
        return same and (self.keys or self.host_trusted(host))

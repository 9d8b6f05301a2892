"""A front door without API keys answers this machine's own names and pages only.

With no key (auth off: a loopback front door for local use), whoever reaches the port may do
anything, loading and unloading models included. Web pages the user opens reach it too: a
cross-site form or a "simple" fetch needs no permission from the server to send a request, and DNS
rebinding re-points a page's own host name to 127.0.0.1 so that the browser even lets it read the
answers. Two checks stop both, on every request while no key exists:

- `Host` must be a loopback name or address (`localhost`, `*.localhost`, 127.0.0.0/8, `::1`) or one
  of `router.allowed_hosts`: a rebinding page's requests carry its own host name;
- `Origin`, when the browser sends one, must name such a host: a page of another site is refused.

Both are a 403 in OpenAI's shape. They apply on loopback, and beyond it once the operator lists
allowed hosts (open access, `router.allow_open_access`). With keys they are not needed: a page
cannot present a key it does not have. Admin POSTs also need a JSON body type, which a form cannot
send (`router.endpoints.admin`).
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from redis.exceptions import RedisError

from router.admission.auth import KeyTable
from router.openai.errors import AuthenticationError, HostNotAllowedError, OriginNotAllowedError
from switchboard.config import FrontDoorConfig
from switchboard.ports import is_loopback_host


async def local_pages_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """App-wide guard: while no API key exists, refuse other hosts' names and other sites' pages."""
    front_door = connection.app.state.front_door
    router: FrontDoorConfig = front_door.settings.router
    if not (is_loopback_host(router.host) or router.allowed_hosts):
        return  # open access beyond loopback, by the operator's choice, to anyone by any name
    if not await _keyless(front_door.key_table):
        return
    check_host(connection.headers.get("host"), router.allowed_hosts)
    check_origin(connection.headers.get("origin"), router.allowed_hosts)


def check_host(host: str | None, allowed: list[str]) -> None:
    """A 403 unless `host` (the header's value, port and all) names this machine or an allowed host."""
    if host is None or not is_local_name(_hostname(f"//{host}"), allowed):
        raise HostNotAllowedError(
            f"This front door has no API key, so it answers only to loopback names, not to "
            f"`{host or 'no Host'}`. Add the name to router.allowed_hosts, or create an API key."
        )


def check_origin(origin: str | None, allowed: list[str]) -> None:
    """A 403 for a request from a web page whose site is neither this machine nor an allowed host."""
    if origin is not None and not is_local_name(_hostname(origin), allowed):
        raise OriginNotAllowedError(
            f"This front door has no API key, so it refuses requests from web pages of other sites "
            f"(`{origin}`). Add the page's host to router.allowed_hosts, or create an API key."
        )


def is_local_name(name: str | None, allowed: list[str]) -> bool:
    """Whether `name` (a host name or address) is this machine's own, or one the operator allowed."""
    if not name:
        return False
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True  # browsers resolve these to loopback themselves (RFC 6761): no DNS to rebind
    if name in {host.lower().rstrip(".") for host in allowed}:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _hostname(url: str) -> str | None:
    try:
        return urlsplit(url).hostname  # lower case, without brackets or port
    except ValueError:
        return None


async def _keyless(table: KeyTable) -> bool:
    """Whether the front door serves everyone without a key now (auth off)."""
    try:
        return (await table.resolve(None)).name is None
    except AuthenticationError:
        return False  # a key is needed: the request must present one
    except RedisError:
        return True  # the keys were never read: hold to the stricter reading

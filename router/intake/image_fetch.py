"""The front door's fetch of an image named by an `http(s)` URL, safe against SSRF.

A chat request's `image_url` part may name its image by URL rather than carry it. Fetching that URL
makes the router a client inside the operator's network, on a caller's say-so: without care a caller
reads the cloud's metadata service (and with it the machine's credentials), or any internal service
that trusts its network, through us. Peer servers shipped exactly this hole. So:

- Nothing is fetched unless the operator says so (`router.image_urls`): "off" by default, "public"
  for any host whose every address is public, or a list of the hosts allowed.
- A host name is resolved once, every address it gives is judged, and the connection goes to an
  address judged, never to the name: a resolver that answers differently the second time (DNS
  rebinding) is never asked a second time.
- Cloud metadata addresses and names are refused in every mode, listed or not.
- Every redirect is a new URL, judged from the start; https never drops to http.
- Deadlines bound the connect and the whole fetch; the body is refused as soon as it passes the
  bound on an image's bytes, so a caller cannot make us buffer more than that.
- The bytes are checked as an image by what they are (`checked_image`), not by their Content-Type.

Every refusal is a 400 in OpenAI's shape that names the part at fault and says what to do instead.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from typing import Any, Literal
from urllib.parse import quote, urljoin, urlsplit

import h11
import msgspec

from router.intake.images import ImageBounds, checked_image
from router.openai.errors import InvalidRequestError
from switchboard.wire import ImageInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_CHARS = 8192
DEFAULT_PORTS = {"http": 80, "https": 443}
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Cloud metadata services (AWS/GCP/Azure/OpenStack; AWS over IPv6; Alibaba): they hand out the
# machine's credentials to whoever asks from inside, so they are never reached, whoever listed them.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address) for address in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata"})
# NAT64's well-known prefix (RFC 6052): an IPv6-only network reaches IPv4 hosts through it, so an
# address in it is judged by the IPv4 address it carries.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# One read of the body: what may be buffered past the bound on an image's bytes.
READ_BYTES = 64 * 1024
REQUEST_HEADERS = [
    ("Accept", "image/*"),
    ("User-Agent", "Switchboard-image-fetch"),
    ("Connection", "close"),
]
# What a path and a query may keep as they are; anything else is percent-encoded for the wire.
PATH_SAFE = "/%!$&'()*+,;=:@"
QUERY_SAFE = PATH_SAFE + "?"


class ImageUrlPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Which remote image URLs the front door fetches, and how long it waits for them."""

    # "off": no remote URL is fetched; "public": any host whose addresses are all public;
    # "listed": only the hosts in `allowed`.
    mode: Literal["off", "public", "listed"] = "off"
    # Entries: "host", "host:port", "scheme://host" or "scheme://host:port" (scheme http or https;
    # without a scheme, https only; without a port, the scheme's). Host names compare
    # case-insensitively; an IP literal is allowed too.
    allowed: tuple[str, ...] = ()
    connect_timeout_s: float = 5.0
    total_timeout_s: float = 20.0
    max_redirects: int = 3

    def __post_init__(self) -> None:
        self.origins()  # an entry that means nothing is the operator's mistake, said at startup

    @classmethod
    def from_setting(cls, setting: str | list[str], **timeouts: Any) -> ImageUrlPolicy:
        """The policy of `router.image_urls`: "off", "public", or a list of the hosts allowed."""
        if isinstance(setting, list) and all(isinstance(entry, str) for entry in setting):
            return cls(mode="listed", allowed=tuple(setting), **timeouts)
        if setting == "off":
            return cls(mode="off", **timeouts)
        if setting == "public":
            return cls(mode="public", **timeouts)
        raise ValueError(
            f'router.image_urls is {setting!r}; give "off", "public", or a list of hosts '
            '("host", "host:port", "https://host", "http://host:port").'
        )

    def origins(self) -> frozenset[tuple[str, str, int]]:
        """The (scheme, host, port) of each allowed entry."""
        return frozenset(_origin(entry) for entry in self.allowed)


class _Target(msgspec.Struct, frozen=True, kw_only=True):
    """One URL fetched, taken apart: where to connect and what to ask for."""

    url: str
    scheme: str
    host: str  # lower case, ASCII (IDNA), without brackets or a trailing dot
    port: int
    path: str  # the request target: path and query, percent-encoded

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


class _Answer(msgspec.Struct, frozen=True, kw_only=True):
    """A response: where it redirects, or else the image's bytes."""

    location: str | None = None
    body: bytes = b""


async def fetch_image(url: str, *, param: str, policy: ImageUrlPolicy, bounds: ImageBounds) -> ImageInput:
    """The image at `url` (http or https), fetched as `policy` allows and checked; a 400 otherwise."""
    try:
        async with asyncio.timeout(policy.total_timeout_s):
            data = await _follow(url, param=param, policy=policy, bounds=bounds)
    except TimeoutError:
        raise _refusal(
            param,
            f"Fetching the image took longer than {policy.total_timeout_s:g} s; send it inline as a "
            "`data:image/...;base64,...` URL, or from a faster host.",
            code="image_fetch_timeout",
        ) from None
    return checked_image(data, param=param, bounds=bounds)


async def _follow(url: str, *, param: str, policy: ImageUrlPolicy, bounds: ImageBounds) -> bytes:
    """The body at `url`, each redirect judged as a URL of its own."""
    for _ in range(policy.max_redirects + 1):
        target = _parsed(url, param)
        _check_allowed(target, policy, param)
        addresses = await _resolved(target, param)
        _check_addresses(target, addresses, policy, param)
        answer = await _exchange(target, addresses, param=param, policy=policy, bounds=bounds)
        if answer.location is None:
            return answer.body
        url = _next_url(target.url, answer.location, param=param)
    raise _refusal(
        param,
        f"The image's URL redirects more than {policy.max_redirects} times; send the URL it ends at, "
        "or the image inline as a data URL.",
        code="image_fetch_failed",
    )


def _parsed(url: str, param: str) -> _Target:
    """`url` taken apart; a 400 unless it is an http(s) URL with a host and no credentials."""
    if len(url) > MAX_URL_CHARS:
        raise _bad_url(
            param, f"The image URL is {len(url):,} characters; at most {MAX_URL_CHARS:,} are taken."
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise _bad_url(param, f"Image URLs of scheme `{scheme}` are not fetched; use https (or a data URL).")
    # Credentials in a URL would be sent on a caller's behalf; a caller has no business with ours.
    if parts.username is not None or parts.password is not None:
        raise _bad_url(param, "An image URL may not carry a user name or password (`user:pass@`).")
    try:
        port = parts.port
        host = _host_name(parts.hostname or "")
    except (ValueError, UnicodeError):
        raise _bad_url(param, "The image URL's host or port cannot be read.") from None
    if not host:
        raise _bad_url(param, "The image URL names no host.")
    request_target = quote(parts.path or "/", safe=PATH_SAFE)
    if parts.query:
        request_target += "?" + quote(parts.query, safe=QUERY_SAFE)
    return _Target(
        url=url,
        scheme=scheme,
        host=host,
        port=DEFAULT_PORTS[scheme] if port is None else port,
        path=request_target,
    )


def _host_name(host: str) -> str:
    """`host` as it is compared and sent: lower case, ASCII, no trailing dot."""
    host = host.lower().rstrip(".")
    return host if host.isascii() else host.encode("idna").decode("ascii")


def _origin(entry: str) -> tuple[str, str, int]:
    """The (scheme, host, port) an `allowed` entry names; ValueError if it names none."""
    text = entry.strip()
    if _ip_literal(text) is not None:  # a bare IPv6 address, whose colons are no port
        text = f"[{text}]" if ":" in text else text
    parts = urlsplit(text if "://" in text else f"https://{text}")
    try:
        port, host = parts.port, _host_name(parts.hostname or "")
    except (ValueError, UnicodeError):
        host, port = "", None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not host or parts.username or parts.path not in ("", "/"):
        raise ValueError(
            f"router.image_urls entry {entry!r} is no host; give 'host', 'host:port', "
            "'https://host' or 'http://host:port'."
        )
    return (scheme, host, DEFAULT_PORTS[scheme] if port is None else port)


def _check_allowed(target: _Target, policy: ImageUrlPolicy, param: str) -> None:
    """A 400 unless the policy lets `target`'s scheme, host and port be fetched at all."""
    if policy.mode == "off":
        raise _not_allowed(
            param,
            "Image URLs are not fetched by this server; send the image inline as a "
            "`data:image/...;base64,...` URL, or ask its operator to allow them (`router.image_urls`).",
        )
    if target.host in METADATA_HOSTS:
        raise _metadata(param, target.host)
    if policy.mode == "listed" and target.origin not in policy.origins():
        raise _not_allowed(
            param,
            f"Images are not fetched from `{target.scheme}://{target.host_header}`; send the image "
            "inline as a data URL, or ask the operator to list the host in `router.image_urls`.",
        )


async def _resolved(target: _Target, param: str) -> list[IPAddress]:
    """The addresses of `target`'s host, resolved once: the only ones it is ever connected to."""
    literal = _ip_literal(target.host)
    if literal is not None:
        return [literal]
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in found))
    except (OSError, UnicodeError, ValueError):
        raise _fetch_failed(param, target, "its host name does not resolve") from None


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _check_addresses(target: _Target, addresses: list[IPAddress], policy: ImageUrlPolicy, param: str) -> None:
    """A 400 if any address is a metadata service, or (for "public") not public.

    Any, not all: a name that resolves to a public and a private address would let the connection
    land on the private one.
    """
    if not addresses:
        raise _fetch_failed(param, target, "its host name has no address")
    if any(_is_metadata(address) for address in addresses):
        raise _metadata(param, target.host)
    if policy.mode == "public" and not all(_is_public(address) for address in addresses):
        raise _not_allowed(
            param,
            f"`{target.host}` is inside a private network (it resolves to an address that is not "
            "public); images are fetched from public hosts only. Send the image inline as a data URL.",
        )


def _is_metadata(address: IPAddress) -> bool:
    return any(form in METADATA_ADDRESSES for form in (address, *_embedded_v4(address)))


def _is_public(address: IPAddress) -> bool:
    """Whether `address` is on the public internet, seen through IPv6's ways of carrying IPv4."""
    if isinstance(address, ipaddress.IPv6Address):
        # An IPv4-mapped or NAT64 address is that IPv4 host, whatever the IPv6 wrapper is classed as.
        carried = address.ipv4_mapped or (_nat64_v4(address) if address in NAT64 else None)
        if carried is not None:
            return _is_public(carried)
        # 6to4 and Teredo tunnel to the IPv4 host they carry: both ends must be public.
        if address.is_site_local or not all(_is_public(v4) for v4 in _embedded_v4(address)):
            return False
    private = (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
    )
    # `is_global` also keeps out what `is_private` lets by: 100.64/10 (carrier-grade NAT).
    return address.is_global and not private


def _embedded_v4(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries (mapped, NAT64, 6to4, Teredo's client)."""
    if isinstance(address, ipaddress.IPv4Address):
        return ()
    carried = [address.ipv4_mapped, address.sixtofour, address.teredo[1] if address.teredo else None]
    if address in NAT64:
        carried.append(_nat64_v4(address))
    return tuple(v4 for v4 in carried if v4 is not None)


def _nat64_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


async def _exchange(
    target: _Target, addresses: list[IPAddress], *, param: str, policy: ImageUrlPolicy, bounds: ImageBounds
) -> _Answer:
    """One GET of `target` at one of `addresses`: its redirect, or its body within the bound."""
    reader, writer = await _connect(target, addresses, param=param, timeout_s=policy.connect_timeout_s)
    try:
        connection = h11.Connection(our_role=h11.CLIENT)
        request = h11.Request(
            method="GET", target=target.path, headers=[("Host", target.host_header), *REQUEST_HEADERS]
        )
        writer.write(connection.send(request) + connection.send(h11.EndOfMessage()))
        await writer.drain()
        response = await _response(connection, reader)
        if response.status_code in REDIRECTS:
            return _Answer(location=_location(response, target, param))
        if response.status_code != 200:
            raise _fetch_failed(param, target, f"it answered HTTP {response.status_code}")
        _check_length(response, target, param, bounds)
        return _Answer(body=await _body(connection, reader, target, param, bounds))
    except (OSError, h11.ProtocolError):
        raise _fetch_failed(param, target, "the connection failed or its answer was no HTTP") from None
    finally:
        writer.close()  # not awaited: a peer that never closes must not hold the request


async def _connect(
    target: _Target, addresses: list[IPAddress], *, param: str, timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of `addresses` that answers: to the address, never to the name.

    TLS is verified against the URL's host, so a checked address serving another's name fails.
    """
    context = _tls_context() if target.scheme == "https" else None
    timed_out = False
    for address in addresses:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(
                    str(address), target.port, ssl=context, server_hostname=target.host if context else None
                ),
                timeout_s,
            )
        except TimeoutError:  # before OSError, of which it is one
            timed_out = True
        except OSError:  # refused, unreachable, or TLS (ssl.SSLError is an OSError)
            timed_out = False
    if timed_out:
        raise _refusal(
            param,
            f"`{target.host}` did not accept a connection within {timeout_s:g} s; send the image inline "
            "as a data URL, or from a host that answers.",
            code="image_fetch_timeout",
        )
    raise _fetch_failed(param, target, "no connection (or no verified TLS) could be made to it")


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # The default context: certificates verified against the system's authorities, names checked.
    return ssl.create_default_context()


async def _response(connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Response:
    """The final response's head (1xx answers are passed over)."""
    while True:
        event = await _next_event(connection, reader)
        if isinstance(event, h11.Response):
            return event


async def _next_event(connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Event:
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(READ_BYTES))  # b"" at the end: h11 sees the close
        elif isinstance(event, h11.Event):
            return event
        else:  # PAUSED: only after a complete response, which a client with Connection: close never reads past
            raise h11.RemoteProtocolError("the answer went on past its end")


def _location(response: h11.Response, target: _Target, param: str) -> str:
    for name, value in response.headers:
        if name == b"location":
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                break
    raise _fetch_failed(param, target, f"it answered HTTP {response.status_code} without a usable Location")


def _next_url(current: str, location: str, *, param: str) -> str:
    """Where a redirect from `current` leads; a 400 if it leaves https for http."""
    url = urljoin(current, location.strip())
    if urlsplit(current).scheme.lower() == "https" and urlsplit(url).scheme.lower() == "http":
        raise _not_allowed(
            param,
            "The image's https URL redirects to plain http, which is not followed; send the image "
            "inline as a data URL, or a URL that stays on https.",
        )
    return url


def _check_length(response: h11.Response, target: _Target, param: str, bounds: ImageBounds) -> None:
    """A 400 before any of the body is read if its stated length passes the bound."""
    for name, value in response.headers:
        if name == b"content-length" and int(value) > bounds.max_image_bytes:  # h11 checked it is digits
            raise _too_large(param, target, bounds)


async def _body(
    connection: h11.Connection, reader: asyncio.StreamReader, target: _Target, param: str, bounds: ImageBounds
) -> bytes:
    """The body (by length, chunks, or to the close), refused as soon as it passes the bound."""
    body = bytearray()
    while True:
        event = await _next_event(connection, reader)
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > bounds.max_image_bytes:
                raise _too_large(param, target, bounds)
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)


def _metadata(param: str, host: str) -> InvalidRequestError:
    return _not_allowed(
        param,
        f"`{host}` is a cloud metadata service, which is never fetched; send the image inline as a "
        "data URL, or from another host.",
    )


def _not_allowed(param: str, message: str) -> InvalidRequestError:
    return _refusal(param, message, code="image_url_not_allowed")


def _bad_url(param: str, message: str) -> InvalidRequestError:
    return _refusal(param, message, code="invalid_image_url")


def _fetch_failed(param: str, target: _Target, why: str) -> InvalidRequestError:
    return _refusal(
        param,
        f"The image could not be fetched from `{target.host}`: {why}. Check the URL, or send the image "
        "inline as a `data:image/...;base64,...` URL.",
        code="image_fetch_failed",
    )


def _too_large(param: str, target: _Target, bounds: ImageBounds) -> InvalidRequestError:
    return _refusal(
        param,
        f"The image at `{target.host}` is more than {bounds.max_image_bytes:,} bytes, the most taken per "
        "image; send it smaller.",
        code="image_too_large",
    )


def _refusal(param: str, message: str, *, code: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)

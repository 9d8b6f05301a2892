"""Where Redis is: one URL, either a server's (`redis://`, `rediss://`, `unix://`) or a Sentinel's.

A primary that Sentinel watches is named by its sentinels and its master name:

    redis+sentinel://[[user]:password@]host1[:26379],host2,host3/<master-name>[/<db>][?options]

The user and password are the primary's (and its replicas'). Sentinels often have no password, or
their own: they get credentials only from the `sentinel_username` and `sentinel_password` options,
because AUTH sent to a sentinel without `requirepass` fails. `rediss+sentinel://` speaks TLS to the
primary and to the sentinels alike; the `ssl_*` options set its certificates.

A URL holds a password, so no error here quotes it; `describe` gives a version for logs.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
DIRECT_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_PORT = 26379
_CREDENTIAL_OPTIONS = ("sentinel_username", "sentinel_password")
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
_CERT_REQS = ("none", "optional", "required")
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_OPTION_NAME = re.compile(r"[a-z_]{1,32}")
EXAMPLE = "redis+sentinel://:PASSWORD@host1:26379,host2:26379,host3:26379/mymaster/0"


class RedisAddressError(ValueError):
    """The Redis URL cannot be used; the message says why, without quoting the URL."""


@dataclasses.dataclass(frozen=True)
class SentinelAddress:
    """A primary found through its sentinels, with what its clients and the sentinels need to connect."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = dataclasses.field(default=None, repr=False)
    tls: bool = False
    # The `ssl_*` options as redis-py's connections take them.
    tls_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def primary_options(self) -> dict[str, Any]:
        """Connection options for the primary (its address comes from the sentinels)."""
        options: dict[str, Any] = {"db": self.db, "username": self.username, "password": self.password}
        if self.tls:
            options.update(ssl=True, **self.tls_options)
        return options

    def sentinel_options(self) -> dict[str, Any]:
        """Connection options for each sentinel."""
        options: dict[str, Any] = {"username": self.sentinel_username, "password": self.sentinel_password}
        if self.tls:
            options.update(ssl=True, **self.tls_options)
        return options

    def describe(self) -> str:
        """The address without credentials, for logs."""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        hosts = ",".join(f"{_url_host(host)}:{port}" for host, port in self.sentinels)
        return f"{scheme}://{hosts}/{self.master_name}/{self.db}"


def parse_redis_url(url: str) -> SentinelAddress | None:
    """The Sentinel address `url` names; None for a server's own URL (used as it is).

    Raises RedisAddressError for a URL of no known scheme or a Sentinel URL that is malformed.
    """
    scheme, separator, rest = url.partition("://")
    scheme = scheme.lower()
    if not separator or (scheme not in SENTINEL_SCHEMES and scheme not in DIRECT_SCHEMES):
        known = ", ".join(f"{name}://" for name in (*DIRECT_SCHEMES, *SENTINEL_SCHEMES))
        raise RedisAddressError(f"the Redis URL must start with one of {known}")
    if scheme in DIRECT_SCHEMES:
        return None
    netloc, _, path_and_query = rest.partition("/")
    path, _, query = path_and_query.partition("?")
    userinfo, at, hosts = netloc.rpartition("@")
    username, password = _credentials(userinfo) if at else (None, None)
    master_name, db = _master_and_db(path)
    options = _options(query)
    tls = SENTINEL_SCHEMES[scheme]
    tls_options = _tls_options(options, tls)
    return SentinelAddress(
        sentinels=_sentinels(hosts),
        master_name=master_name,
        db=db,
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        tls=tls,
        tls_options=tls_options,
    )


def checked_redis_url(url: str | None, url_file: str | None) -> str | None:
    """`url`, else the URL kept in `url_file` (None if neither), checked; the errors never quote
    the URL or what the file holds (they carry a password)."""
    if url is None and url_file:
        url = _read_url_file(url_file)
    if url is not None:
        try:
            parse_redis_url(url)
        except RedisAddressError as exc:
            raise RedisAddressError(f"invalid redis.url: {exc}") from None
    return url


def _read_url_file(path: str) -> str:
    try:
        url = Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise RedisAddressError(f"cannot read redis.url_file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RedisAddressError(f"redis.url_file {path} is not UTF-8 text") from None
    if not url:
        raise RedisAddressError(
            f"redis.url_file {path} is empty; it should hold a URL like redis://:PASSWORD@host:6379/0"
        )
    return url


def describe(url: str) -> str:
    """`url` without its credentials, for logs; a URL that does not parse is not shown at all."""
    try:
        address = parse_redis_url(url)
    except RedisAddressError:
        return "(a Redis URL that does not parse)"
    if address is not None:
        return address.describe()
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    if not colon:
        # `redis+sentinel://secret@host` is read as redis-py reads `redis://secret@host`: a password.
        return None, unquote(user) or None
    return unquote(user) or None, unquote(password) or None


def _sentinels(hosts: str) -> tuple[tuple[str, int], ...]:
    if not hosts:
        raise RedisAddressError(f"a Sentinel URL lists its sentinels' host[:port]s: {EXAMPLE}")
    return tuple(_host_and_port(entry) for entry in hosts.split(","))


def _host_and_port(entry: str) -> tuple[str, int]:
    if entry.startswith("["):  # [IPv6 address]:port
        host, bracket, port = entry[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise RedisAddressError("a sentinel's IPv6 address must be written [address]:port")
        port = port[1:]
    else:
        host, _, port = entry.partition(":")
    if not host:
        raise RedisAddressError(f"a sentinel's host is empty in the Sentinel URL: {EXAMPLE}")
    if not port:
        return host, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisAddressError("a sentinel's port must be a number from 1 to 65535")
    return host, int(port)


def _master_and_db(path: str) -> tuple[str, int]:
    parts = path.split("/") if path else []
    if not parts or not parts[0] or len(parts) > 2:
        raise RedisAddressError(f"a Sentinel URL names its primary, then optionally a db: {EXAMPLE}")
    master_name = unquote(parts[0])
    if len(parts) == 1 or parts[1] == "":
        return master_name, 0
    if not parts[1].isdigit():
        raise RedisAddressError("the db in a Sentinel URL must be a number (0 when left out)")
    return master_name, int(parts[1])


def _options(query: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in _CREDENTIAL_OPTIONS and name not in _TLS_OPTIONS:
            known = ", ".join((*_CREDENTIAL_OPTIONS, *_TLS_OPTIONS))
            # A name that is not an option's may be a misplaced secret: only a plain word is quoted.
            shown = repr(name) if _OPTION_NAME.fullmatch(name) else "(not shown)"
            raise RedisAddressError(f"unknown option {shown} in the Sentinel URL; known: {known}")
        if name in options:
            raise RedisAddressError(f"option {name!r} is given twice in the Sentinel URL")
        options[name] = value
    return options


def _tls_options(options: dict[str, str], tls: bool) -> dict[str, Any]:
    given = {name: value for name, value in options.items() if name in _TLS_OPTIONS}
    if given and not tls:
        raise RedisAddressError("the ssl_* options need TLS: write rediss+sentinel://")
    result: dict[str, Any] = {}
    for name, value in given.items():
        if name == "ssl_cert_reqs":
            if value.lower() not in _CERT_REQS:
                raise RedisAddressError(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}")
            result[name] = value.lower()
        elif name == "ssl_check_hostname":
            if value.lower() not in _BOOLEANS:
                raise RedisAddressError("ssl_check_hostname must be true or false")
            result[name] = _BOOLEANS[value.lower()]
        elif not value:
            raise RedisAddressError(f"option {name!r} needs a file path")
        else:
            result[name] = value
    return result


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host

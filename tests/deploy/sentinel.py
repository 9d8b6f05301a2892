"""Redis under Sentinel as the deployment files give it: env.example's settings for the compose
profile, and a `redis+sentinel://` URL read into its parts, as the product reads it.

The URL is read here on its own terms (the form README and switchboard/config.py document), so the
deployment files are checked whether or not this checkout's product reads such URLs yet; where it
does (`switchboard.redis_address`), its reading must agree.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from typing import Any
from urllib.parse import parse_qsl, unquote

from tests.support.deploy.compose_file import EXAMPLE_ENV, REPO, interpolate

DEFAULT_SENTINEL_PORT = 26379
ENV_EXAMPLE = REPO / "deploy" / "compose" / "env.example"
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")


def _commented_setting(name: str, containing: str) -> str:
    """A setting env.example offers commented out (`# NAME=value`), the one whose value has `containing`."""
    (value,) = [
        found[1]
        for found in re.finditer(rf"^# {name}=(\S+)$", ENV_EXAMPLE.read_text(), re.MULTILINE)
        if containing in found[1]
    ]
    return value


# A .env filled in as env.example says for Redis under Sentinel: its commented lines taken up.
SENTINEL_ENV = {
    **EXAMPLE_ENV,
    "COMPOSE_PROFILES": _commented_setting("COMPOSE_PROFILES", "sentinel"),
    "REDIS_URL": interpolate(_commented_setting("REDIS_URL", "+sentinel://"), EXAMPLE_ENV),
}


@dataclasses.dataclass(frozen=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int
    password: str | None
    sentinel_password: str | None


def read_sentinel_url(url: str) -> SentinelUrl:
    """The parts of `url`; the product's own reading, where it has one, must be the same."""
    scheme, _, rest = url.partition("://")
    assert scheme in ("redis+sentinel", "rediss+sentinel"), "not a Sentinel URL"
    netloc, _, path_and_query = rest.partition("/")
    path, _, query = path_and_query.partition("?")
    userinfo, _, hosts = netloc.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) or None
    master_name, _, db = path.partition("/")
    options = dict(parse_qsl(query))
    ours = SentinelUrl(
        sentinels=tuple(_host_and_port(entry) for entry in hosts.split(",")),
        master_name=master_name,
        db=int(db or 0),
        password=password,
        sentinel_password=options.get("sentinel_password"),
    )
    theirs = _product_reading(url)
    if theirs is not None:
        assert {field.name: getattr(theirs, field.name) for field in dataclasses.fields(ours)} == (
            dataclasses.asdict(ours)
        ), "the product reads the URL otherwise"
    return ours


def _host_and_port(entry: str) -> tuple[str, int]:
    host, _, port = entry.partition(":")
    return host, int(port or DEFAULT_SENTINEL_PORT)


def _product_reading(url: str) -> Any:
    """What the product makes of the URL, or None in a checkout whose product has no such reader."""
    if importlib.util.find_spec("switchboard.redis_address") is None:
        return None
    module = importlib.import_module("switchboard.redis_address")
    return module.parse_redis_url(url)

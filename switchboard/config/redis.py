"""Where the queue lives (`[redis]`): the server's address, the key prefix, and the private
redis-server of `switchboard up`."""

from __future__ import annotations

from typing import Annotated

import msgspec

from switchboard import keys


class RedisConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where the queue lives. No URL means `switchboard up` starts a private redis-server.

    A password goes in the URL (`redis://:PASSWORD@host:6379/0`, or `redis://USER:PASSWORD@...` with
    ACL users); `rediss://` speaks TLS. A primary that Sentinel watches is reached through its
    sentinels, and every part follows a failover without a restart:
    `redis+sentinel://:PASSWORD@host1:26379,host2,host3/MASTER_NAME/0?sentinel_password=...`
    (`rediss+sentinel://` for TLS, with `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs`
    and `ssl_check_hostname` options; see switchboard/redis_address.py).
    """

    url: str | None = None
    # A file that holds the URL (a mounted secret, say), so that a password in it is on no command
    # line and in no environment; `url` wins where both are set. Read once, at start.
    url_file: str | None = None
    # Every key Switchboard writes starts with this, so that several deployments can share a Redis.
    key_prefix: Annotated[str, msgspec.Meta(max_length=64, pattern=keys.PREFIX_PATTERN)] = "sb"
    # The private redis-server of `switchboard up` holds at most this much (Redis units: "512mb",
    # "2gb"); past it, writes are refused (noeviction) and requests get a 503 instead of losing jobs.
    private_maxmemory: Annotated[str, msgspec.Meta(pattern=r"^[0-9]+([kmg]b?)?$")] = "1gb"
    # Where that private Redis keeps its append-only file, so that queued jobs, API keys and
    # measured load times survive a restart of it; "" keeps nothing.
    private_dir: str = "~/.cache/switchboard/redis"

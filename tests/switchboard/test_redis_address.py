"""Redis URLs: a Sentinel's parsed into what its clients need, a server's left as it is, bad ones refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.config import ConfigError, load_settings
from switchboard.redis_address import (
    RedisAddressError,
    SentinelAddress,
    describe,
    parse_redis_url,
)

SECRET = "s3cr%40t"  # "s3cr@t", quoted as a URL writes it


def test_a_sentinel_url_names_the_sentinels_the_primary_and_its_credentials() -> None:
    address = parse_redis_url(
        f"redis+sentinel://app:{SECRET}@s1:26380,s2,10.0.0.3:26381/mymaster/2"
        "?sentinel_username=watch&sentinel_password=w%26tch"
    )
    assert address == SentinelAddress(
        sentinels=(("s1", 26380), ("s2", 26379), ("10.0.0.3", 26381)),
        master_name="mymaster",
        db=2,
        username="app",
        password="s3cr@t",
        sentinel_username="watch",
        sentinel_password="w&tch",
    )
    assert address.primary_options() == {"db": 2, "username": "app", "password": "s3cr@t"}
    assert address.sentinel_options() == {"username": "watch", "password": "w&tch"}


def test_defaults_no_credentials_db_zero_and_the_sentinel_port() -> None:
    address = parse_redis_url("redis+sentinel://host/primary")
    assert address == SentinelAddress(sentinels=(("host", 26379),), master_name="primary")
    # The primary's password is not sent to the sentinels: AUTH to one without requirepass fails.
    only_primary = parse_redis_url("redis+sentinel://:pw@host/primary/")
    assert only_primary is not None
    assert only_primary.password == "pw" and only_primary.db == 0
    assert only_primary.sentinel_options() == {"username": None, "password": None}


def test_ipv6_sentinels_are_written_in_brackets() -> None:
    address = parse_redis_url("redis+sentinel://[::1]:26400,[fe80::2]/m")
    assert address is not None
    assert address.sentinels == (("::1", 26400), ("fe80::2", 26379))
    assert address.describe() == "redis+sentinel://[::1]:26400,[fe80::2]:26379/m/0"


def test_rediss_sentinel_speaks_tls_to_both_with_the_ssl_options() -> None:
    address = parse_redis_url(
        "rediss+sentinel://:pw@h1,h2/m?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
        "&ssl_cert_reqs=Required&ssl_check_hostname=false"
    )
    assert address is not None and address.tls
    tls = {
        "ssl": True,
        "ssl_ca_certs": "/ca.pem",
        "ssl_certfile": "/c.pem",
        "ssl_keyfile": "/k.pem",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": False,
    }
    assert address.primary_options() == {"db": 0, "username": None, "password": "pw", **tls}
    assert address.sentinel_options() == {"username": None, "password": None, **tls}


@pytest.mark.parametrize(
    "url",
    ["redis://:pw@host:6379/0", "rediss://host:6380", "unix:///run/redis.sock?db=1", "REDIS://host"],
)
def test_a_servers_own_url_is_used_as_it_is(url: str) -> None:
    assert parse_redis_url(url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://host:6379", "must start with one of"),
        ("host:6379", "must start with one of"),
        (f"redis+sentinel://:{SECRET}@/m", "host[:port]s"),
        (f"redis+sentinel://:{SECRET}@h1,,h2/m", "host is empty"),
        (f"redis+sentinel://:{SECRET}@h1:0/m", "port must be a number"),
        (f"redis+sentinel://:{SECRET}@h1:70000/m", "port must be a number"),
        (f"redis+sentinel://:{SECRET}@h1:port/m", "port must be a number"),
        (f"redis+sentinel://:{SECRET}@[::1/m", "IPv6"),
        (f"redis+sentinel://:{SECRET}@h1", "names its primary"),
        (f"redis+sentinel://:{SECRET}@h1/", "names its primary"),
        (f"redis+sentinel://:{SECRET}@h1/m/0/x", "names its primary"),
        (f"redis+sentinel://:{SECRET}@h1/m/zero", "db in a Sentinel URL must be a number"),
        (f"redis+sentinel://:{SECRET}@h1/m?socket_timeout=1", "unknown option 'socket_timeout'"),
        (f"redis+sentinel://:pw@h1/m?sentinel_password={SECRET}&sentinel_password=x", "twice"),
        (f"redis+sentinel://:{SECRET}@h1/m?ssl_ca_certs=/ca.pem", "need TLS"),
        (f"rediss+sentinel://:{SECRET}@h1/m?ssl_cert_reqs=maybe", "ssl_cert_reqs must be"),
        (f"rediss+sentinel://:{SECRET}@h1/m?ssl_check_hostname=perhaps", "true or false"),
        (f"rediss+sentinel://:{SECRET}@h1/m?ssl_ca_certs=", "needs a file path"),
    ],
)
def test_a_bad_url_is_refused_without_quoting_its_password(url: str, says: str) -> None:
    with pytest.raises(RedisAddressError) as info:
        parse_redis_url(url)
    assert says in str(info.value)
    assert "s3cr" not in str(info.value)


def test_an_unknown_option_that_may_be_a_misplaced_secret_is_not_shown() -> None:
    with pytest.raises(RedisAddressError) as info:
        parse_redis_url("redis+sentinel://h1/m?Tr0ub4dor-3")
    assert "Tr0ub4dor" not in str(info.value) and "unknown option" in str(info.value)


def test_describe_leaves_the_credentials_out() -> None:
    assert (
        describe(f"rediss+sentinel://u:{SECRET}@h1,h2:26400/m/3?sentinel_password={SECRET}")
        == "rediss+sentinel://h1:26379,h2:26400/m/3"
    )
    assert describe(f"redis://:{SECRET}@host:6379/0") == "redis://host:6379/0"
    assert describe(f"unix:///run/redis.sock?password={SECRET}") == "unix:///run/redis.sock"
    assert "s3cr" not in describe(f"bogus://:{SECRET}@host")


def test_load_settings_refuses_a_bad_redis_url_without_quoting_it() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={"REDIS_URL": f"redis+sentinel://:{SECRET}@h1:99999/m"})
    assert "invalid redis.url" in str(info.value) and "s3cr" not in str(info.value)


def test_load_settings_takes_a_sentinel_url_from_a_file(tmp_path: Path) -> None:
    url_file = tmp_path / "redis.url"
    url_file.write_text("redis+sentinel://:pw@s1,s2,s3/switchboard/0\n")
    settings = load_settings(None, environ={"REDIS_URL_FILE": str(url_file)})
    assert settings.redis.url == "redis+sentinel://:pw@s1,s2,s3/switchboard/0"

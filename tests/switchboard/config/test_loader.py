"""Settings: defaults, TOML file, environment overrides, and loud errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.config import (
    DEMO_MODEL_NAME,
    ConfigError,
    ModelConfig,
    Settings,
    load_settings,
)

TWO_MODELS = """
[router]
port = 9000
host = "127.0.0.1"

[worker]
models = ["small"]
max_concurrent_jobs = 8

[[models]]
name = "small"
path = "/models/small"
engine_args = { max_model_len = 2048, enforce_eager = true }

[[models]]
name = "Qwen/Qwen3-0.6B"
path = "/models/qwen"
engine = "trtllm"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "switchboard.toml"
    path.write_text(text)
    return path


def test_defaults_serve_the_demo_model() -> None:
    settings = load_settings(None, environ={})
    assert [m.name for m in settings.models] == [DEMO_MODEL_NAME]
    assert DEMO_MODEL_NAME == "switchboard-demo"
    demo = settings.models[0]
    assert demo.engine_name == "vllm"
    assert not demo.path.startswith("~")
    assert demo.engine_args
    assert settings.redis.url is None
    assert settings.router.port == 8000
    assert settings.worker.models == []
    assert settings.worker_models() == settings.models


def test_toml_file(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, TWO_MODELS), environ={})
    assert settings.router.port == 9000
    assert settings.router.host == "127.0.0.1"
    assert settings.worker.max_concurrent_jobs == 8
    assert [m.name for m in settings.models] == ["small", "Qwen/Qwen3-0.6B"]
    small = settings.models[0]
    assert small.path == "/models/small"
    assert small.engine_name == "vllm"
    assert small.engine_args == {"max_model_len": 2048, "enforce_eager": True}
    assert settings.models[1].engine == "trtllm"
    assert settings.models[1].engine_args == {}
    # Untouched sections keep their defaults.
    assert settings.redis.url is None
    assert settings.worker.reserved_cores == 1


def test_model_lookup_and_worker_models(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, TWO_MODELS), environ={})
    small = settings.model("small")
    assert isinstance(small, ModelConfig)
    assert small.path == "/models/small"
    assert settings.model("Qwen/Qwen3-0.6B") is settings.models[1]
    assert settings.model("missing") is None
    assert [m.name for m in settings.worker_models()] == ["small"]


def test_worker_models_empty_means_all() -> None:
    settings = Settings(
        models=[ModelConfig(name="a", path="/a"), ModelConfig(name="b", path="/b")],
    )
    assert [m.name for m in settings.worker_models()] == ["a", "b"]
    settings.worker.models = ["b"]
    assert [m.name for m in settings.worker_models()] == ["b"]


def test_environment_overrides(tmp_path: Path) -> None:
    environ = {
        "SWITCHBOARD_ROUTER__PORT": "8001",
        "REDIS_URL": "redis://example:6379/0",
        "SWITCHBOARD_WORKER__MODELS": '["Qwen/Qwen3-0.6B"]',
        "SWITCHBOARD_WORKER__COALESCE_MS": "2.5",
        "SWITCHBOARD_ROUTER__HOST": "localhost",
        "UNRELATED": "x",
        "SWITCHBOARD_NO_SEPARATOR": "ignored",
    }
    settings = load_settings(write(tmp_path, TWO_MODELS), environ=environ)
    assert settings.router.port == 8001
    assert isinstance(settings.router.port, int)
    assert settings.router.host == "localhost"
    assert settings.redis.url == "redis://example:6379/0"
    assert settings.worker.models == ["Qwen/Qwen3-0.6B"]
    assert settings.worker.coalesce_ms == 2.5
    assert [m.name for m in settings.worker_models()] == ["Qwen/Qwen3-0.6B"]
    # Fields not overridden keep the file's values.
    assert settings.worker.max_concurrent_jobs == 8


def test_environment_overrides_without_file() -> None:
    settings = load_settings(
        None,
        environ={"SWITCHBOARD_ROUTER__PORT": "8001", "SWITCHBOARD_WORKER__MODELS": '["switchboard-demo"]'},
    )
    assert settings.router.port == 8001
    assert settings.worker.models == [DEMO_MODEL_NAME]


def test_environment_section_names_are_case_insensitive() -> None:
    settings = load_settings(None, environ={"SWITCHBOARD_Router__Port": "8123"})
    assert settings.router.port == 8123


def test_redis_url_field_override_is_a_string() -> None:
    settings = load_settings(None, environ={"SWITCHBOARD_REDIS__URL": "redis://h:1"})
    assert settings.redis.url == "redis://h:1"


def test_empty_redis_url_is_ignored() -> None:
    assert load_settings(None, environ={"REDIS_URL": ""}).redis.url is None


def test_environment_does_not_leak_from_os(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_ROUTER__PORT", "8555")
    assert load_settings(None, environ={}).router.port == 8000
    assert load_settings(None).router.port == 8555


# --- errors ---------------------------------------------------------------------------------------


def load_error(tmp_path: Path, text: str | None, environ: dict[str, str] | None = None) -> str:
    path = write(tmp_path, text) if text is not None else None
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ=environ or {})
    return str(info.value)


def test_duplicate_model_names(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        """
[[models]]
name = "a"
path = "/x"
[[models]]
name = "a"
path = "/y"
""",
    )
    assert "unique" in message
    assert "a" in message


def test_worker_models_naming_unknown_model(tmp_path: Path) -> None:
    message = load_error(tmp_path, TWO_MODELS.replace('models = ["small"]', 'models = ["smal"]'))
    assert "smal" in message
    assert "worker.models" in message
    assert "small" in message  # the configured names are listed


def test_worker_models_env_naming_unknown_model() -> None:
    with pytest.raises(ConfigError, match="nope"):
        load_settings(None, environ={"SWITCHBOARD_WORKER__MODELS": '["nope"]'})


def test_unknown_field_in_section(tmp_path: Path) -> None:
    message = load_error(tmp_path, "[router]\nprot = 8001\n")
    assert "prot" in message
    assert "router" in message


def test_unknown_field_in_model(tmp_path: Path) -> None:
    message = load_error(tmp_path, '[[models]]\nname = "a"\npath = "/a"\nengin = "vllm"\n')
    assert "engin" in message


def test_unknown_section(tmp_path: Path) -> None:
    assert "routr" in load_error(tmp_path, "[routr]\nport = 1\n")


def test_unknown_field_from_environment() -> None:
    with pytest.raises(ConfigError, match="prot"):
        load_settings(None, environ={"SWITCHBOARD_ROUTER__PROT": "8001"})


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[router]\nport = "abc"\n', "port"),
        ("[router]\nport = 70000\n", "port"),
        ("[worker]\nmax_concurrent_jobs = 0\n", "max_concurrent_jobs"),
        ('[worker]\nmodels = "a"\n', "models"),
        ('[[models]]\nname = "a"\npath = "/a"\nengine = "tgi"\n', "engine"),
        ('[[models]]\nname = "a"\n', "path"),
        ('[[models]]\nname = "a"\npath = "/a"\nweight = 0\n', "weight"),
        ('[[models]]\nname = "a"\npath = "/a"\nweight = -1.5\n', "weight"),
        ('[[models]]\nname = "a"\npath = "/a"\npriority = 1.5\n', "priority"),
        ("[worker]\nfair_shares = 3\n", "fair_shares"),
    ],
)
def test_bad_values(tmp_path: Path, text: str, field: str) -> None:
    message = load_error(tmp_path, text)
    assert "invalid configuration" in message
    assert field in message


def test_models_share_a_worker_equally_unless_told_otherwise(tmp_path: Path) -> None:
    text = '[[models]]\nname = "a"\npath = "/a"\n[[models]]\nname = "b"\npath = "/b"\npriority = 2\nweight = 0.5\n'
    settings = load_settings(write(tmp_path, text), environ={"SWITCHBOARD_WORKER__FAIR_SHARES": "false"})
    a, b = settings.models
    assert (a.priority, a.weight, b.priority, b.weight) == (0, 1.0, 2, 0.5)
    assert not settings.worker.fair_shares
    assert load_settings(None, environ={}).worker.fair_shares


def test_bad_type_from_environment() -> None:
    with pytest.raises(ConfigError, match="port"):
        load_settings(None, environ={"SWITCHBOARD_ROUTER__PORT": "eighty"})


@pytest.mark.parametrize("name", ["has space", "semi;colon", "", "a" * 129, "ünï"])
def test_invalid_model_names(tmp_path: Path, name: str) -> None:
    message = load_error(tmp_path, f'[[models]]\nname = "{name}"\npath = "/a"\n')
    assert "name" in message


@pytest.mark.parametrize("name", ["a", "Qwen/Qwen3-0.6B", "org.model:v1_x-2", "a" * 128])
def test_valid_model_names(tmp_path: Path, name: str) -> None:
    settings = load_settings(write(tmp_path, f'[[models]]\nname = "{name}"\npath = "/a"\n'), environ={})
    assert settings.models[0].name == name


def test_invalid_toml(tmp_path: Path) -> None:
    message = load_error(tmp_path, "[router\nport = \n")
    assert "cannot read config file" in message
    assert "switchboard.toml" in message


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        load_settings(missing, environ={})
    assert "nope.toml" in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path, environ={})


@pytest.mark.parametrize(
    ("text", "environ"),
    [
        (TWO_MODELS, {"SWITCHBOARD_MODELS__NAME": "x"}),
        ("router = 5\n", {"SWITCHBOARD_ROUTER__PORT": "8001"}),
    ],
)
def test_env_override_of_non_table_section_is_a_config_error(
    tmp_path: Path, text: str, environ: dict[str, str]
) -> None:
    with pytest.raises(ConfigError):
        load_settings(write(tmp_path, text), environ=environ)


@pytest.mark.parametrize(("first", "second"), [("org/model", "org_model"), ("Tiny", "tiny"), ("a:b", "A/B")])
def test_models_that_would_share_a_triton_name_are_refused(tmp_path: Path, first: str, second: str) -> None:
    message = load_error(
        tmp_path, f'[[models]]\nname = "{first}"\npath = "/x"\n[[models]]\nname = "{second}"\npath = "/y"\n'
    )
    assert first in message and second in message and "rename one" in message


def test_serverless_settings_are_read_and_checked(tmp_path: Path) -> None:
    settings = load_settings(
        write(
            tmp_path,
            """
[worker]
max_loaded_models = 1
memory_budget_gib = 70

[[models]]
name = "big"
path = "/models/big"
keep_alive_s = -1
min_replicas = 1
max_replicas = 2
preload = true
footprint_gib = 40
""",
        ),
        environ={},
    )
    (big,) = settings.models
    assert (big.keep_alive_s, big.min_replicas, big.max_replicas, big.preload) == (-1, 1, 2, True)
    assert big.footprint_gib == 40 and settings.worker.max_loaded_models == 1
    message = load_error(
        tmp_path, '[[models]]\nname = "x"\npath = "/x"\nmin_replicas = 3\nmax_replicas = 2\n'
    )
    assert "min_replicas (3) is above max_replicas (2)" in message
    assert "keep_alive_s" in load_error(tmp_path, '[[models]]\nname = "x"\npath = "/x"\nkeep_alive_s = -5\n')


def test_safe_defaults_for_keys_limits_and_exposure() -> None:
    settings = load_settings(None, environ={})
    assert settings.router.host == "127.0.0.1"
    assert settings.router.allow_open_access is False
    assert (settings.redis.key_prefix, settings.redis.private_maxmemory) == ("sb", "1gb")
    assert (settings.auth.required, settings.auth.keys, settings.auth.admin_key_sha256) == (False, [], None)
    assert settings.auth.cache_s == 2.0
    limits = settings.limits
    assert (limits.max_in_flight, limits.max_queue_depth) == (2048, 1024)
    assert limits.estimated_completion_tokens == 256


KEYED = f"""
[redis]
key_prefix = "prod:sb"

[auth]
required = true

[[auth.keys]]
name = "alice"
sha256 = "{"a" * 64}"
models = ["small"]
rpm = 60
tpm = 100000
max_parallel = 4

[[auth.keys]]
name = "ops"
sha256 = "{"b" * 64}"
admin = true

[limits]
max_queue_depth = 10

[[models]]
name = "small"
path = "/models/small"
"""


def test_keys_and_limits_from_the_file_and_the_admin_key_from_the_environment(tmp_path: Path) -> None:
    environ = {"SWITCHBOARD_AUTH__ADMIN_KEY_SHA256": "c" * 64, "SWITCHBOARD_LIMITS__MAX_IN_FLIGHT": "50"}
    settings = load_settings(write(tmp_path, KEYED), environ=environ)
    alice, ops = settings.auth.keys
    assert (alice.name, alice.models, alice.rpm, alice.tpm, alice.max_parallel, alice.admin) == (
        "alice",
        ["small"],
        60,
        100000,
        4,
        False,
    )
    assert (ops.models, ops.rpm, ops.admin) == ([], None, True)
    assert settings.auth.admin_key_sha256 == "c" * 64
    assert settings.auth.required is True
    assert (settings.limits.max_queue_depth, settings.limits.max_in_flight) == (10, 50)
    assert settings.redis.key_prefix == "prod:sb"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('sha256 = "' + "a" * 64 + '"', 'sha256 = "not-a-hash"'), "sha256"),
        (('name = "ops"', 'name = "alice"'), "repeated: alice"),
        (('sha256 = "' + "b" * 64 + '"', 'sha256 = "' + "a" * 64 + '"'), "same sha256"),
        (('models = ["small"]', 'models = ["large"]'), "unknown models: large"),
        (("rpm = 60", "rpm = 0"), "rpm"),
        (('key_prefix = "prod:sb"', 'key_prefix = "has space"'), "key_prefix"),
        (('key_prefix = "prod:sb"', 'key_prefix = "trailing:"'), "key_prefix"),
    ],
)
def test_bad_keys_and_prefixes_are_refused(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path, KEYED.replace(*change, 1)), environ={})


SECRET_URL = "redis://:s3cret-password@db.internal:6379/0"


def secret_file(tmp_path: Path, text: str = SECRET_URL + "\n") -> Path:
    path = tmp_path / "redis-url"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_the_redis_url_is_read_from_the_file_named_by_redis_url_file(tmp_path: Path) -> None:
    path = secret_file(tmp_path)
    assert load_settings(None, environ={"REDIS_URL_FILE": str(path)}).redis.url == SECRET_URL
    config = write(tmp_path, f'[redis]\nurl_file = "{path}"\n')
    assert load_settings(config, environ={}).redis.url == SECRET_URL


def test_redis_url_wins_over_a_url_file_and_the_environment_over_the_config_file(tmp_path: Path) -> None:
    path = secret_file(tmp_path)
    assert load_settings(
        None, environ={"REDIS_URL": "redis://h:1", "REDIS_URL_FILE": str(path)}
    ).redis.url == ("redis://h:1")
    config = write(tmp_path, '[redis]\nurl = "redis://from-the-file:1"\n')
    assert load_settings(config, environ={"REDIS_URL_FILE": str(path)}).redis.url == SECRET_URL


def test_an_unreadable_or_empty_url_file_fails_loudly_without_quoting_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read redis\.url_file"):
        load_settings(None, environ={"REDIS_URL_FILE": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="is empty"):
        load_settings(None, environ={"REDIS_URL_FILE": str(secret_file(tmp_path, "\n"))})
    binary = secret_file(tmp_path, "")
    binary.write_bytes(b"redis://:pass\xff@h:1")
    with pytest.raises(ConfigError) as caught:
        load_settings(None, environ={"REDIS_URL_FILE": str(binary)})
    assert "pass" not in str(caught.value).replace("password", "")

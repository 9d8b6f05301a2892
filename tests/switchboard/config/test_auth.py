"""`[auth]`'s token quotas: a key's own per day and month, its team, and the teams' shared quotas."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.config import ConfigError, Settings, load_settings

TEAMED = f"""
[[auth.keys]]
name = "alice"
sha256 = "{"a" * 64}"
tokens_per_day = 1000
tokens_per_month = 20000
team = "acme"
max_batch_lines_in_flight = 8

[[auth.keys]]
name = "bob"
sha256 = "{"b" * 64}"

[auth.teams.acme]
tokens_per_month = 50000
"""


def load(tmp_path: Path, text: str) -> Settings:
    config = tmp_path / "switchboard.toml"
    config.write_text(text)
    return load_settings(config, environ={})


def test_quotas_team_and_batch_bound_from_the_file(tmp_path: Path) -> None:
    settings = load(tmp_path, TEAMED)
    alice, bob = settings.auth.keys
    assert (alice.tokens_per_day, alice.tokens_per_month, alice.team) == (1000, 20000, "acme")
    assert alice.max_batch_lines_in_flight == 8
    assert (bob.tokens_per_day, bob.tokens_per_month, bob.team, bob.max_batch_lines_in_flight) == (None,) * 4
    acme = settings.auth.teams["acme"]
    assert (acme.tokens_per_day, acme.tokens_per_month) == (None, 50000)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('team = "acme"', 'team = "acme-typo"'),
            "names team 'acme-typo', which has no \\[auth.teams.acme-typo\\]",
        ),
        (("tokens_per_day = 1000", "tokens_per_day = 0"), "tokens_per_day"),
        (("tokens_per_month = 50000", "tokens_per_month = -1"), "tokens_per_month"),
        (("[auth.teams.acme]", '[auth.teams."a b"]'), "teams"),
    ],
)
def test_a_config_key_names_a_configured_team_and_quotas_are_positive(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, TEAMED.replace(*change, 1))

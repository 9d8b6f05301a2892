"""Model pipelines in the configuration: fallbacks over models and routes, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.config import ConfigError, Settings, load_settings

MODELS = """
[[models]]
name = "big"
path = "/m/big"

[[models]]
name = "small"
path = "/m/small"

[[models]]
name = "chat-v2"
path = "/m/v2"

[[models]]
name = "coder"
path = "/m/coder"

[routes.chat]
targets = {"big" = 90, "chat-v2" = 10}
"""


# The router's own table last, so that a case may add fields to it.
ROUTER_TARGETS = """
[pipelines.p.router.targets.code]
model = "coder"
description = "programming"
"""
ROUTER = (
    ROUTER_TARGETS
    + """
[pipelines.p.router.targets.chat]
model = "big"
description = "everything else"
[pipelines.p.router]
model = "small"
default = "code"
"""
)
CASCADE = "[pipelines.p.cascade]\ndraft = 'small'\nstrong = 'big'"
CASCADE_Q = "\n[pipelines.q.cascade]\ndraft = 'small'\nstrong = 'big'\n"


def settings_with(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "sb.toml"
    path.write_text(MODELS + text)
    return load_settings(path, environ={})


def test_a_pipeline_of_fallbacks_names_models_and_routes_in_order(tmp_path: Path) -> None:
    key = f'\n[[auth.keys]]\nname = "app"\nsha256 = "{"0" * 64}"\nmodels = ["resilient"]\n'
    settings = settings_with(tmp_path, '[pipelines.resilient]\nfallbacks = ["chat", "small"]\n' + key)
    assert settings.pipelines["resilient"].steps() == ["chat", "small"]
    assert settings.auth.keys[0].models == ["resilient"]


@pytest.mark.parametrize(
    ("pipelines", "says"),
    [
        ('[pipelines.big]\nfallbacks = ["small", "chat"]', "may not take the name of a model"),
        ('[pipelines.chat]\nfallbacks = ["small", "big"]', "may not take the name of a route"),
        ('[pipelines.p]\nfallbacks = ["small"]', "at least two steps"),
        ('[pipelines.p]\nfallbacks = ["small", "big", "small"]', "repeated: small"),
        ('[pipelines.p]\nfallbacks = ["small", "huge"]', "'huge' is no model, route or pipeline"),
        ('[pipelines.p]\nfallbacks = ["small", "big"]\nrouter = "x"', "invalid configuration"),
        ("[pipelines.p]\nfallbacks = ['small', 'big']\n" + CASCADE, "exactly one of"),
        ("[pipelines.p]", "exactly one of"),
        (ROUTER.replace('default = "code"', 'default = "poetry"'), "'poetry' is no target's label"),
        (ROUTER.replace('"coder"', '"p"'), "loop: p -> p"),
        (ROUTER.replace('model = "small"', 'model = "q"') + CASCADE_Q, "names the pipeline 'q'"),
        (ROUTER + "prompt = 'Pick one: {targets}'", "placeholders {targets} and {request}"),
        (ROUTER + "prompt = '{targets} {request} {user}'", "it has request, targets, user"),
        (ROUTER + "logit_bias = {'abc' = 5}", "token ids, not 'abc'"),
        (ROUTER + "warm_margin = 2", "invalid configuration"),
        (ROUTER_TARGETS + "[pipelines.p.router]\nmodel = 'small'\ndefault = 'code'", "two targets"),
        ("[pipelines.p.cascade]\ndraft = 'small'\nstrong = 'small'", "must differ"),
        ("[pipelines.p.cascade]\ndraft = 'q'\nstrong = 'big'\n" + CASCADE_Q, "names the pipeline 'q'"),
        ("[pipelines.p.cascade]\ndraft = 'small'\nstrong = 'big'\nmin_mean_logprob = 0.5", "invalid"),
        ("[pipelines.p]\nfallbacks = ['small', 'q']\n" + CASCADE_Q, "'q' is a cascade pipeline"),
        (
            "[pipelines.p]\nfallbacks = ['small', 'q']\n[pipelines.q]\nfallbacks = ['big', 'p']",
            "loop: p -> q -> p",
        ),
        ('[pipelines."team/p"]\nfallbacks = ["small", "big"]', "invalid configuration"),
    ],
)
def test_a_pipeline_the_config_cannot_use_is_a_config_error(
    tmp_path: Path, pipelines: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        settings_with(tmp_path, pipelines)


def test_a_router_pipeline_reads_its_targets_prompt_and_defaults(tmp_path: Path) -> None:
    pipeline = settings_with(tmp_path, ROUTER).pipelines["p"]
    assert pipeline.shape == "router" and pipeline.router is not None
    assert pipeline.steps() == ["small", "coder", "big"]
    assert pipeline.router.default == "code" and pipeline.router.timeout_s == 2.0
    assert "{targets}" in pipeline.router.prompt and "{request}" in pipeline.router.prompt


def test_a_cascade_may_escalate_to_another_pipeline(tmp_path: Path) -> None:
    text = "[pipelines.p.cascade]\ndraft = 'small'\nstrong = 'q'\nmin_mean_logprob = -0.5\n"
    settings = settings_with(tmp_path, text + "[pipelines.q]\nfallbacks = ['big', 'chat']\n")
    cascade = settings.pipelines["p"].cascade
    assert cascade is not None and (cascade.strong, cascade.min_mean_logprob) == ("q", -0.5)


def test_a_route_may_name_a_pipeline_and_a_pipeline_of_fallbacks_another(tmp_path: Path) -> None:
    text = (
        "[routes.smart]\ntargets = {'big' = 90, 'p' = 10}\n"
        "[pipelines.p]\nfallbacks = ['q', 'small']\n[pipelines.q]\nfallbacks = ['chat', 'coder']\n"
    )
    settings = settings_with(tmp_path, text)
    assert list(settings.routes["smart"].targets) == ["big", "p"]
    assert settings.pipelines["p"].steps() == ["q", "small"]


def test_a_route_leading_back_to_itself_through_a_pipeline_is_refused_with_the_path(tmp_path: Path) -> None:
    text = "[routes.smart]\ntargets = {'big' = 90, 'p' = 10}\n[pipelines.p]\nfallbacks = ['smart', 'small']\n"
    with pytest.raises(ConfigError, match="loop: smart -> p -> smart"):
        settings_with(tmp_path, text)


def test_a_model_a_pipeline_asks_as_its_router_warms_its_structured_output_as_it_loads(
    tmp_path: Path,
) -> None:
    settings = settings_with(tmp_path, ROUTER)
    warmed = {model.name for model in settings.models if model.warm_structured_output}
    assert warmed == {"small"}


def chain_of_pairs(levels: int) -> str:
    """Two pipelines per level, each naming both of the level below: 2^levels paths from the top."""
    text = '[pipelines.a0]\nfallbacks = ["big", "small"]\n[pipelines.b0]\nfallbacks = ["small", "big"]\n'
    for level in range(1, levels):
        below = f'"a{level - 1}", "b{level - 1}"'
        text += f"[pipelines.a{level}]\nfallbacks = [{below}]\n[pipelines.b{level}]\nfallbacks = [{below}]\n"
    return text


def test_pipelines_nested_too_deep_or_expanding_too_far_are_config_errors(tmp_path: Path) -> None:
    # Seven levels of pairs expand to 255 names (allowed); eight to 511 (refused, at most 256).
    assert "a6" in settings_with(tmp_path, chain_of_pairs(7)).pipelines
    with pytest.raises(ConfigError, match=r"a7: expands to more than 256 steps .* at most 256"):
        settings_with(tmp_path, chain_of_pairs(8))
    # A straight chain: the route `chat`, then eight pipelines in a row, each naming the one before.
    straight = '[pipelines.c0]\nfallbacks = ["chat", "small"]\n'
    straight += "".join(f'[pipelines.c{n}]\nfallbacks = ["c{n - 1}", "small"]\n' for n in range(1, 8))
    assert "c7" not in settings_with(tmp_path, straight.rsplit("[pipelines.c7]", 1)[0]).pipelines
    with pytest.raises(ConfigError, match=r"c7: leads through 9 routes and pipelines .* at most 8"):
        settings_with(tmp_path, straight)

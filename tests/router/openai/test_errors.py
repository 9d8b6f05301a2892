"""A 404 for an unknown model names the models the caller may use: the first few of a large catalogue."""

from __future__ import annotations

from router.openai.errors import MODELS_NAMED_IN_404, ModelNotFoundError


def test_a_few_models_are_all_named() -> None:
    assert str(ModelNotFoundError("x", ["a", "b"])).endswith("Models you may use here: a, b.")


def test_a_catalogue_of_thousands_names_the_first_few_and_points_to_the_list() -> None:
    names = [f"ft-{n}" for n in range(10_000)]
    message = str(ModelNotFoundError("x", names))
    assert f"ft-{MODELS_NAMED_IN_404 - 1}," in message or f"ft-{MODELS_NAMED_IN_404 - 1} and" in message
    assert f"ft-{MODELS_NAMED_IN_404}," not in message
    assert f"and {10_000 - MODELS_NAMED_IN_404} more (GET /v1/models lists them all)" in message
    assert len(message) < 500


def test_an_unknown_caller_is_told_no_names() -> None:
    assert "may use" not in str(ModelNotFoundError("x", []))

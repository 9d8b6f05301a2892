"""A model's path read as a location: a local folder, a prefix of a bucket, a Hub repository at a
revision; every wrong one a ValueError that says what is wrong and what to write."""

from __future__ import annotations

import pytest

from switchboard.sources.locations import HubLocation, LocalFolder, S3Location, is_remote, parse_location


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("/models/llama", LocalFolder("/models/llama")),
        ("models/llama", LocalFolder("models/llama")),
        ("s3://team-models/llama", S3Location(bucket="team-models", prefix="llama")),
        ("s3://team-models/org/llama/", S3Location(bucket="team-models", prefix="org/llama")),
        ("s3://team.models-1", S3Location(bucket="team.models-1", prefix="")),
        ("s3://team-models/", S3Location(bucket="team-models", prefix="")),
        ("hf://org/name", HubLocation(repo="org/name", revision=None)),
        ("hf://Org-1/name_2.5@v1.0", HubLocation(repo="Org-1/name_2.5", revision="v1.0")),
        ("hf://org/name@refs/pr/1", HubLocation(repo="org/name", revision="refs/pr/1")),
    ],
)
def test_each_kind_of_path_reads_as_its_location(path: str, location: object) -> None:
    assert parse_location(path) == location


def test_a_hub_revision_is_pinned_only_when_it_is_a_commit_id() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert HubLocation(repo="org/name", revision=commit).pinned
    assert not HubLocation(repo="org/name", revision="main").pinned
    assert not HubLocation(repo="org/name", revision=commit[:12]).pinned, "a short id may be a branch's name"
    assert not HubLocation(repo="org/name").pinned


def test_locations_are_frozen_values() -> None:
    location = parse_location("s3://team-models/llama")
    with pytest.raises(AttributeError):
        location.prefix = "other"  # type: ignore[union-attr,misc]
    assert {location, parse_location("s3://team-models/llama/")} == {location}


def test_only_store_paths_are_remote() -> None:
    assert is_remote("s3://team-models/llama") and is_remote("hf://org/name@v1")
    assert not is_remote("/models/s3://odd-name") and not is_remote("models/llama")


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("s3://", "names no bucket: write s3://bucket/prefix"),
        ("s3:///llama", "names no bucket"),
        ("s3://Team_Models/llama", "'Team_Models' is not a bucket name"),
        ("s3://ab/llama", "'ab' is not a bucket name"),
        ("s3://team..models/llama", "is not a bucket name"),
        ("s3://team-models/a//b", "empty, '.' or '..' parts"),
        ("s3://team-models/a/../b", "empty, '.' or '..' parts"),
        ("hf://llama", "write a Hub model as hf://org/name"),
        ("hf://org/name/extra", "write a Hub model as hf://org/name"),
        ("hf://org/bad name", "write a Hub model as hf://org/name"),
        ("hf://org/name@", "the revision after '@' is empty"),
        ("hf://org/name@  ", "the revision after '@' is empty"),
        ("gs://bucket/llama", "a local folder, s3://bucket/prefix or hf://org/name[@revision], not gs://"),
        ("https://huggingface.co/org/name", "not https://"),
        ("", "the model's path is empty"),
    ],
)
def test_a_wrong_path_says_what_is_wrong(path: str, says: str) -> None:
    with pytest.raises(ValueError) as wrong:
        parse_location(path)
    assert says in str(wrong.value)

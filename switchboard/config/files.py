"""Uploaded files (`[files]`): where their contents are kept, how large they may be, and how long
they live. Used by the Files API (`/v1/files`) and the Batch API's input, output and error files."""

from __future__ import annotations

from typing import Annotated

import msgspec

from switchboard.config.models import StorageConfig

DAY_S = 24 * 3600


class FilesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The file store."""

    # A folder on the front door's disk (the all-in-one stack's default), or `s3://bucket/prefix` for
    # deployments with several front doors (any S3-compatible store, read as model sources read one).
    store: str = "~/.local/share/switchboard/files"
    # The bucket's endpoint, region or profile, where the environment does not say them.
    storage: StorageConfig | None = None
    # OpenAI's limits for a batch's input file: 200 MB and 50,000 requests.
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 200 * 1024 * 1024
    max_file_lines: Annotated[int, msgspec.Meta(ge=1)] = 50_000
    # A file is deleted this long after its upload unless its upload asked for less
    # (`expires_after`); batches' output and error files live as long (OpenAI keeps them 30 days).
    max_age_s: Annotated[float, msgspec.Meta(ge=3600)] = 30 * DAY_S

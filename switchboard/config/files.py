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


class BatchesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the Batch API's lines run (`[batches]`): in the batch tier, below every interactive job."""

    # Lines of all batches queued at once by the front door that runs them (each key's own bound is
    # `auth.keys.max_batch_lines_in_flight`). Queued lines wait in their models' batch tier, where a
    # worker takes them only with slots no interactive job wants (`worker.max_batch_jobs`): enough of
    # them queued keeps every such slot busy.
    max_lines_in_flight: Annotated[int, msgspec.Meta(ge=1)] = 128
    # Batch lines alone neither load a model nor keep it warm. A batch whose window would not hold
    # at the pace it runs (the time left is below this margin plus the time its remaining lines
    # would take) moves up to the flex tier: its lines then load their models like any request.
    deadline_margin_s: Annotated[float, msgspec.Meta(ge=0)] = 4 * 3600.0

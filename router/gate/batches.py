"""The gates of the Batch API's writes: a batch's creation, and its cancel (which has no body)."""

from __future__ import annotations

import msgspec

from router.gate.admin import ADMIN_MAX_BODY_BYTES
from router.gate.gate import Gate, unchecked
from router.openai.batches import BatchCreate


class NoBody(msgspec.Struct, forbid_unknown_fields=False):
    """A POST whose body says nothing (empty, or `{}`)."""


BATCH_CREATE = Gate("batches", msgspec.json.Decoder(BatchCreate), unchecked, max_bytes=ADMIN_MAX_BODY_BYTES)
BATCH_CANCEL = Gate(
    "batches", msgspec.json.Decoder(NoBody), unchecked, max_bytes=ADMIN_MAX_BODY_BYTES, empty_as=b"{}"
)

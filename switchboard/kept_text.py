"""A text cut to what its last tokens can span, before anything tokenizes it.

`truncate_prompt_tokens` keeps the last so many tokens of each input, so the rest of a longer text
is read only to be dropped: a 64 KB rerank query once cost its worker a whole tokenization per
document. No token stands for more than `chars_per_token` characters, so the last `tokens` tokens
of a text lie within its last `tokens * chars_per_token` characters; a text is cut a little before
that span, where a run of whitespace begins, so that every tokenizer that splits words at
whitespace (WordPiece, byte-level BPE, SentencePiece's Metaspace) makes the same tokens of what is
kept as of the whole. With no whitespace near the cut (a blob, unspaced script), the cut falls
`CUT_SLACK_CHARS` before the span, which keeps the tokens the cut changes well outside it.

The front door cuts with `FRONT_DOOR_CHARS_PER_TOKEN` (it does not know the model's tokenizer); the
worker cuts again with its tokenizer's own longest token (`ModelLimits.max_token_chars`). Characters
a tokenizer's normalizer drops (control characters; combining accents for an uncased model) count as
kept, so a text made mostly of them keeps fewer tokens than it asked for.
"""

from __future__ import annotations

import msgspec

from switchboard.wire import PoolingTask

# What the front door assumes one token spans at most. Real text averages 3-5 characters a token
# and the demo models' longest token is 18; a vocabulary with longer tokens (runs of spaces or
# dashes in code tokenizers) keeps fewer tokens than asked only where the kept ones average more
# than this, and its worker's own cut is then the one that counts.
FRONT_DOOR_CHARS_PER_TOKEN = 64
# How far before the kept span a cut may look for the start of a run of whitespace.
CUT_SLACK_CHARS = 256


def kept_tail(text: str, tokens: int, chars_per_token: int) -> str:
    """The end of `text` that holds its last `tokens` tokens, whole where it is short enough."""
    span = tokens * chars_per_token
    if len(text) <= span + CUT_SLACK_CHARS:
        return text
    latest = len(text) - span  # the kept span starts at or after this
    earliest = latest - CUT_SLACK_CHARS
    for cut in range(latest, earliest, -1):
        if text[cut].isspace() and not text[cut - 1].isspace():
            return text[cut:]
    return text[earliest:]


def front_door_cut(task: PoolingTask) -> PoolingTask:
    """`task` with its texts (and its query) cut to what the tokens it keeps can span; itself where
    it keeps every token, or as many as the model takes (-1: the front door does not know how many)."""
    keep = task.truncate_prompt_tokens
    if keep is None or keep < 1:
        return task
    inputs = tuple(
        kept_tail(item, keep, FRONT_DOOR_CHARS_PER_TOKEN) if isinstance(item, str) else item
        for item in task.inputs
    )
    query = kept_tail(task.query, keep, FRONT_DOOR_CHARS_PER_TOKEN) if task.query is not None else None
    if query is task.query and all(new is old for new, old in zip(inputs, task.inputs, strict=True)):
        return task
    return msgspec.structs.replace(task, inputs=inputs, query=query)

"""The front door's settings (`[router]`): where it listens, how long requests may take, how slow
clients and oversized requests are bounded. Part of `switchboard.config.settings.Settings`."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class FrontDoorConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The front door."""

    # Loopback by default: serving other machines is a choice (see allow_open_access).
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    # A front door on a non-loopback address with no API key refuses to start unless this is true
    # (then it serves everyone, admin endpoints included, and says so in a warning).
    allow_open_access: bool = False
    # How long a request may wait for its job to finish before the client gets a 504.
    request_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    # A streamed response holds its headers back this long for the first chunk, so that what is
    # known before the first token (a failed load, a bad prompt) is a real HTTP status.
    first_byte_budget_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # Past that, while the request waits (a model loads, say), the stream gets a keep-alive this
    # often (with the load's progress as a comment for clients that asked for resumable streams).
    load_progress_every_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    # Request bodies larger than this are refused (413) before they are read.
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 10 * 1024 * 1024
    # A streamed client that leaves mid-stream may resume it (`Last-Event-ID`), through any front
    # door, for this long before its job gets the cancel mark (0: cancelled at once).
    resume_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # `/readyz` is ready once Redis answers, whether or not a worker is alive: for deployments that
    # scale workers to zero, where the request that makes a worker start must reach a front door.
    ready_without_workers: bool = False
    # Slow clients. A request's headers must arrive within this many seconds of its first byte (a
    # new connection's first request: of the connection's opening), or it gets a 408 and is closed.
    header_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    # An upload that sends nothing for this long is closed (a 499: the client's doing).
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # An upload slower than this on average, once its grace has passed, is closed (a 499): each byte
    # buys the client 1/rate s more, so a body trickled a byte at a time holds nothing for long
    # (0: no minimum rate). At the defaults a 10 MiB body may take 2.8 hours to arrive; the deadline
    # below comes first.
    body_min_rate_bytes_s: Annotated[float, msgspec.Meta(ge=0)] = 1024.0
    body_rate_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    # A body not whole this long after its headers is closed (a 499), whatever its rate: a 10 MiB
    # body needs 35 KiB/s.
    body_deadline_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # Bodies being read at once hold their bytes (Content-Length, else as they come) in two budgets:
    # one per API key (all keyless callers share one), past which a body is a 429, and one for the
    # front door, past which it is a 503; both with Retry-After. Unset: 2 and 32 times max_body_bytes
    # (20 and 320 MiB; a front door is given 1 GiB, and each body read is then decoded).
    max_body_bytes_in_flight_per_key: Annotated[int, msgspec.Meta(ge=1024)] | None = None
    max_body_bytes_in_flight: Annotated[int, msgspec.Meta(ge=1024)] | None = None
    # A client that takes no byte of its answer for this long (the front door's writing paused) is
    # cut off (a 499: a stream's job is cancelled). A long stream to a client that reads is never cut.
    send_stall_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # Once an answer is whole in the front door's hands (a stream at its end), what is left of it
    # must be taken within this long: a client reading a byte now and then is cut off too.
    send_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 120.0
    # A kept-alive connection with no request for this long is closed.
    keep_alive_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # Connections open at once. Past it an idle kept-alive one is closed to make room, or else the
    # new one is answered 503 at once and closed. Lowered at start to what the process's open-file
    # limit (`ulimit -n`) leaves room for.
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 4096
    # Host names (or addresses) a front door without API keys answers to besides loopback ones
    # (`localhost`, 127.0.0.0/8, ::1): with no key, a request naming another Host, or sent from a web
    # page of another origin, is refused (403), so that no web page can use it (DNS rebinding,
    # cross-site forms). Beyond loopback (allow_open_access) an empty list accepts every Host.
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    # Bounds on one request, checked before it is queued (router/openai/bounds.py), so that no single
    # request costs a model's worker seconds before its first token while other streams wait. Past
    # one, the request is a 400 naming the parameter. Each is far above what real requests send:
    # messages in one chat request (a 340,000-message body once kept a worker busy for 3.7 s);
    max_messages: Annotated[int, msgspec.Meta(ge=1)] = 2048
    # all of a chat request's `tools` together, as JSON (each tool's schema is also bounded below);
    max_tools_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 256 * 1024
    # one JSON schema (`response_format`, `structured_outputs.json`, a tool's parameters), regular
    # expression, grammar, or list of choices (its strings together): the engine compiles each into
    # a grammar, at a cost that grows faster than its size (a schema of 1,200 optional properties,
    # 86 KB, took 2.9 s on the demo model's 400-token vocabulary);
    max_structured_output_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 32 * 1024
    # and entries of `structured_outputs.choice` (12,000 once kept an engine busy for 28 s).
    max_structured_output_choices: Annotated[int, msgspec.Meta(ge=1)] = 256
    # A rerank's `query`, in characters, truncated or not: it is paired with every document (a 64 KB
    # query with 256 documents once kept a reranker busy for 60 s).
    max_rerank_query_chars: Annotated[int, msgspec.Meta(ge=1024)] = 256 * 1024
    # Values one pooling answer holds (inputs times an embedding's dimensions): it crosses Redis
    # twice and is built as JSON. The default admits 2,048 inputs of a 4,096-dimension embedder.
    max_pooling_output_values: Annotated[int, msgspec.Meta(ge=2048)] = 2048 * 4096
    # Images in chat and Responses requests (router/intake/images.py), each bound a 400 naming the
    # part: images in one request;
    max_images_per_request: Annotated[int, msgspec.Meta(ge=1)] = 8
    # the bytes of one image (decoded) and of all a request's images together (they travel with the
    # job, through Redis);
    max_image_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 10 * 1024 * 1024
    max_images_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 20 * 1024 * 1024
    # and the pixels of one image, read from its header before it is decoded, so that a
    # decompression bomb is refused for what it says it is. 4096 x 4096 is more than any vision
    # model's processor keeps.
    max_image_pixels: Annotated[int, msgspec.Meta(ge=1)] = 4096 * 4096
    # Image URLs other than `data:` ones, fetched by the front door: "off" (the default: send images
    # inline), "public" (any host whose every address is public: never loopback, private,
    # link-local, multicast or cloud-metadata addresses), or the hosts allowed, as "host" (https),
    # "host:port" or "scheme://host[:port]": a listed host may be a private one (the operator named
    # it); metadata addresses are never reached. An address is resolved once and connected to as
    # checked, and every redirect is checked again (router/intake/image_fetch.py).
    image_urls: Literal["off", "public"] | list[str] = "off"
    # A fetch's deadline to connect, and for the whole of it (redirects and body included).
    image_fetch_connect_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    image_fetch_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 20.0

    def __post_init__(self) -> None:
        # The largest body taken must always fit its key's budget, and that budget the front door's.
        per_key = self.max_body_bytes_in_flight_per_key
        if per_key is not None and per_key < self.max_body_bytes:
            raise ValueError(
                f"router.max_body_bytes_in_flight_per_key ({per_key}) must be at least "
                f"router.max_body_bytes ({self.max_body_bytes})"
            )
        total = self.max_body_bytes_in_flight
        if total is not None and total < (per_key or self.max_body_bytes):
            raise ValueError(
                f"router.max_body_bytes_in_flight ({total}) must be at least "
                f"router.max_body_bytes_in_flight_per_key and router.max_body_bytes"
            )

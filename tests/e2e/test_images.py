"""Images in, through every real part: the openai client → front door → Redis → two workers whose
vLLM CPU engines run a tiny vision-language model the tests build (switchboard/local/demo_vision_model.py,
random weights: it talks nonsense, but its vision tower and processor are real, so an image changes
the answer). Images come as data URLs and as URLs of a local test server that the operator allowed
(`router.image_urls`); every refusal is a 400 before anything is queued.

One stack for the whole file (two engine loads), its last test killing a worker mid-stream.
"""

from __future__ import annotations

import asyncio
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import openai
import pytest
import redis
from PIL import Image

from switchboard import keys
from switchboard.local.demo_model import config_entry
from switchboard.local.demo_vision_model import IMAGE_SEQ_LEN, build_demo_vision_model
from tests.e2e.conftest import FAST_TAKEOVER
from tests.support.images import data_url
from tests.support.job_workers import running_worker
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

VLM = "tiny-vlm"
TEXT = "tiny-text"
PROMPT = "What is in the picture?"


def png(pattern: str, size: int = 56) -> bytes:
    """A solid red square, or (`noise`) a square of random grey pixels: two very different images."""
    if pattern == "noise":
        image = Image.effect_noise((size, size), 90).convert("RGB")
    else:
        image = Image.new("RGB", (size, size), (220, 20, 20))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


RED, NOISE = png("red"), png("noise")


class ImageServer(http.server.ThreadingHTTPServer):
    """A local server of images and of redirects to where no image fetch may go."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ImageHandler)
        self.hits: list[str] = []

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ImageHandler(http.server.BaseHTTPRequestHandler):
    server: ImageServer
    REDIRECTS: ClassVar[dict[str, str]] = {
        "/to-metadata": "http://169.254.169.254/latest/meta-data/",
        "/to-unlisted": "http://localhost:{port}/red.png",
    }

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        if self.path == "/red.png":
            self._answer(200, RED, "image/png")
        elif self.path in self.REDIRECTS:
            self.send_response(302)
            self.send_header("Location", self.REDIRECTS[self.path].format(port=self.server.server_address[1]))
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._answer(404, b"no such image", "text/plain")

    def _answer(self, status: int, body: bytes, media: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[ImageServer]:
    server = ImageServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def vlm_stack(
    tmp_path_factory: pytest.TempPathFactory,
    demo_model_dir: Path,
    image_server: ImageServer,
    request: pytest.FixtureRequest,
) -> Iterator[Stack]:
    """Two workers each holding the vision model warm (a takeover needs the second), a text model
    (never loaded: its refusal is the front door's), and remote images allowed from the local server."""
    root = tmp_path_factory.mktemp("images")
    folder = build_demo_vision_model(root / "vlm")
    vlm = {**config_entry(folder, name=VLM, preload=True, min_replicas=2), "engine_args": VLM_ENGINE_ARGS}
    config = {
        "router": {
            "image_urls": [image_server.origin],
            "max_images_per_request": 3,
            "max_image_bytes": 1024 * 1024,
        },
        "models": [vlm, config_entry(demo_model_dir, name=TEXT)],
    }
    with running_stack(
        config, root=root / "stack", workers=2, env=FAST_TAKEOVER, session=request.session
    ) as stack:
        stack.wait_serving(VLM)
        yield stack


# The demo model's settings, and room for a few images per prompt.
VLM_ENGINE_ARGS = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True}


def client_of(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def image_message(*urls: str, text: str = PROMPT) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": parts}]


def ask(stack: Stack, *urls: str, model: str = VLM, max_tokens: int = 12, stream: bool = False) -> Any:
    with client_of(stack) as client:
        created = client.chat.completions.create(
            model=model,
            messages=image_message(*urls),  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            stream=stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        if not stream:
            return created
        return "".join(chunk.choices[0].delta.content or "" for chunk in created if chunk.choices)


def test_the_same_image_gives_the_same_answer_alone_and_in_a_batch(vlm_stack: Stack) -> None:
    alone = ask(vlm_stack, data_url(RED)).choices[0].message.content
    other = ask(vlm_stack, data_url(NOISE)).choices[0].message.content
    assert alone and other and alone != other, "two images, two answers"

    async def batch() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{vlm_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=VLM,
                        messages=image_message(data_url(image)),  # type: ignore[arg-type]
                        max_tokens=12,
                        temperature=0,
                    )
                    for image in (RED, NOISE, RED, NOISE)
                )
            )
        return [reply.choices[0].message.content or "" for reply in replies]

    assert asyncio.run(batch()) == [alone, other, alone, other]


def test_usage_counts_the_image_tokens_and_streams_answer_as_the_whole(vlm_stack: Stack) -> None:
    with client_of(vlm_stack) as client:
        text_only = client.chat.completions.create(
            model=VLM,
            messages=image_message(),
            max_tokens=4,
            temperature=0,  # type: ignore[arg-type]
        )
    with_two = ask(vlm_stack, data_url(RED), data_url(NOISE), max_tokens=4)
    assert text_only.usage is not None and with_two.usage is not None
    assert with_two.usage.prompt_tokens - text_only.usage.prompt_tokens >= 2 * IMAGE_SEQ_LEN
    whole = ask(vlm_stack, data_url(RED)).choices[0].message.content
    assert ask(vlm_stack, data_url(RED), stream=True) == whole


def test_an_allowed_url_is_fetched_and_answers_as_the_same_image_inline(
    vlm_stack: Stack, image_server: ImageServer
) -> None:
    inline = ask(vlm_stack, data_url(RED)).choices[0].message.content
    assert ask(vlm_stack, f"{image_server.origin}/red.png").choices[0].message.content == inline
    assert ask(vlm_stack, f"{image_server.origin}/red.png", stream=True) == inline
    assert "/red.png" in image_server.hits


def test_responses_take_input_images(vlm_stack: Stack) -> None:
    inline = ask(vlm_stack, data_url(NOISE)).choices[0].message.content
    content = [{"type": "input_text", "text": PROMPT}, {"type": "input_image", "image_url": data_url(NOISE)}]
    with client_of(vlm_stack) as client:
        response = client.responses.create(
            model=VLM,
            input=[{"role": "user", "content": content}],  # type: ignore[list-item]
            max_output_tokens=12,
            temperature=0,
        )
        assert response.output_text == inline
        streamed = client.responses.create(
            model=VLM,
            input=[{"role": "user", "content": content}],  # type: ignore[list-item]
            max_output_tokens=12,
            temperature=0,
            stream=True,
        )
        deltas = [event.delta for event in streamed if event.type == "response.output_text.delta"]
    assert "".join(deltas) == inline


def test_models_say_which_take_images(vlm_stack: Stack) -> None:
    with client_of(vlm_stack) as client:
        cards = {card.id: card.model_dump() for card in client.models.list()}
    assert cards[VLM]["input_modalities"] == ["text", "image"]
    assert cards[TEXT]["input_modalities"] == ["text"]


def queued(stack: Stack) -> int:
    with redis.Redis.from_url(stack.redis_url) as client:
        return sum(int(client.xlen(keys.job_stream(model))) for model in (VLM, TEXT))


def test_every_refusal_is_a_400_naming_the_part_with_nothing_queued(
    vlm_stack: Stack, image_server: ImageServer
) -> None:
    origin = image_server.origin
    big = png("noise", size=1024)  # about 3 MB: past the 1 MiB an image may have here
    cases = [
        ((f"{origin}/to-metadata",), VLM, "image_url_not_allowed", "image_url"),
        (("http://169.254.169.254/latest/meta-data/",), VLM, "image_url_not_allowed", "image_url"),
        (("http://10.1.2.3/cat.png",), VLM, "image_url_not_allowed", "image_url"),
        (("https://images.example.com/cat.png",), VLM, "image_url_not_allowed", "image_url"),
        ((f"{origin}/to-unlisted",), VLM, "image_url_not_allowed", "image_url"),
        ((f"{origin}/missing.png",), VLM, "image_fetch_failed", "image_url"),
        ((data_url(RED),) * 4, VLM, "too_many_images", "image_url"),
        ((data_url(big),), VLM, "image_too_large", "image_url"),
        ((data_url(b"GIF89a, but not really"),), VLM, "invalid_image", "image_url"),
        ((data_url(RED),), TEXT, "model_takes_no_images", "messages"),
    ]
    before = queued(vlm_stack)
    for urls, model, code, param_end in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            ask(vlm_stack, *urls, model=model)
        body: dict[str, Any] = caught.value.body  # type: ignore[assignment]
        assert (body["code"], body["type"]) == (code, "invalid_request_error"), (urls[0][:60], body)
        assert body["param"].endswith(param_end), body
        if model == TEXT:
            assert f"`{TEXT}`" in body["message"]
    assert queued(vlm_stack) == before, "nothing was queued"


def test_an_image_stream_whose_worker_is_killed_goes_on_from_another_worker(vlm_stack: Stack) -> None:
    reference = ask(vlm_stack, data_url(NOISE), max_tokens=300)
    assert reference.usage is not None and reference.usage.completion_tokens > 100, "a long answer"
    with client_of(vlm_stack) as client:
        stream = client.chat.completions.create(
            model=VLM,
            messages=image_message(data_url(NOISE)),  # type: ignore[arg-type]
            max_tokens=300,
            temperature=0,
            stream=True,
        )
        text, killed, sent_before_kill = "", None, ""
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if killed is None and text:
                killed = vlm_stack.wait_until(
                    lambda: running_worker(vlm_stack, VLM), timeout_s=30, what="its worker"
                )
                killed.kill()
                sent_before_kill = text
    assert killed is not None
    assert len(text) > len(sent_before_kill), "it went on after the kill"
    assert text == reference.choices[0].message.content, "the same greedy answer, seamless"

"""Remote image URLs fetched at the front door (router/intake/image_fetch.py), against a real HTTP
server on 127.0.0.1: what the policy lets through, every way inside the network refused (private and
metadata addresses, redirects there, a resolver that changes its answer), and the bounds on time and
bytes."""

from __future__ import annotations

import asyncio
import io
import ipaddress
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from PIL import Image

from router.intake.image_fetch import ImageUrlPolicy, _is_public, _next_url, fetch_image
from router.intake.images import ImageBounds
from router.openai.errors import InvalidRequestError

PARAM = "messages[0].content[1].image_url.url"
BOUNDS = ImageBounds(max_image_bytes=64 * 1024)
PNG_SIZE = (32, 24)


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", PNG_SIZE, (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def answer(status: str, body: bytes = b"", headers: tuple[str, ...] = ()) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Server:
    """A small HTTP/1.1 server with canned answers, which records what it was asked."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            line, *fields = head.strip().split("\r\n")
            path = line.split(" ")[1]
            request = {
                "path": path,
                **{k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)},
            }
            self.requests.append(request)
            await self._answer(path, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up, as it should when it has read enough
        finally:
            writer.close()

    async def _answer(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if path == "/silent":
            await reader.read()  # answers nothing, until the client gives up and closes
        elif path == "/chunked-big":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:  # no length said, and no end: a client that buffers it all times out instead
                writer.write(b"4000\r\n" + b"\0" * 0x4000 + b"\r\n")
                await writer.drain()
        else:
            writer.write(self._canned(path))
            await writer.drain()

    def _canned(self, path: str) -> bytes:
        if path == "/ok.png":
            return answer("200 OK", png(), ("Content-Type: text/plain",))  # the type is not trusted
        if path == "/chunked.png":
            data = png()
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (data[:50], data[50:]))
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        if path == "/big":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n" + b"\0" * 1000
        if path == "/text":
            return answer("200 OK", b"not an image at all", ("Content-Type: image/png",))
        if path == "/loop":
            return answer("302 Found", headers=("Location: /loop",))
        if path.startswith("/redirect?to="):
            return answer("302 Found", headers=(f"Location: {path.removeprefix('/redirect?to=')}",))
        return answer("404 Not Found", b"no such image")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    serving = Server()
    await serving.start()
    yield serving
    await serving.stop()


def listed(*entries: str, **settings: Any) -> ImageUrlPolicy:
    return ImageUrlPolicy(
        mode="listed", allowed=entries, **{"connect_timeout_s": 1.0, "total_timeout_s": 2.0, **settings}
    )


PUBLIC = ImageUrlPolicy(mode="public", connect_timeout_s=1.0, total_timeout_s=2.0)


async def refused(url: str, policy: ImageUrlPolicy, code: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        await fetch_image(url, param=PARAM, policy=policy, bounds=BOUNDS)
    assert caught.value.param == PARAM
    assert caught.value.status_code == 400
    assert caught.value.code == code, caught.value.message
    return caught.value


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Fails the test on any connection attempt: what must be refused before one is made."""
    attempts: list[tuple[Any, ...]] = []

    async def connect(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise AssertionError(f"a connection was attempted to {args}")

    monkeypatch.setattr(asyncio, "open_connection", connect)
    return attempts


def fake_resolver(
    monkeypatch: pytest.MonkeyPatch, answers: Callable[[int], list[str]]
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """The loop's getaddrinfo replaced: the `n`th call answers `answers(n)`; `.calls` counts them."""
    loop = asyncio.get_running_loop()
    calls: list[str] = []

    async def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[Any]:
        calls.append(host)
        return [
            (socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
            for ip in answers(len(calls))
        ]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    getaddrinfo.calls = calls  # type: ignore[attr-defined]
    return getaddrinfo


# -- the policy -------------------------------------------------------------------------------------


def test_the_setting_gives_the_policy() -> None:
    assert ImageUrlPolicy.from_setting("off").mode == "off"
    assert ImageUrlPolicy.from_setting("public", total_timeout_s=3.0).total_timeout_s == 3.0
    policy = ImageUrlPolicy.from_setting(["Images.Example", "http://10.0.0.7:8080", "[::1]:9000", "::2"])
    assert policy.mode == "listed"
    assert policy.origins() == {
        ("https", "images.example", 443),
        ("http", "10.0.0.7", 8080),
        ("https", "::1", 9000),
        ("https", "::2", 443),
    }
    for wrong in ("on", "all", ["ftp://host"], ["https://host/path"], ["user@host"]):
        with pytest.raises(ValueError, match="image_urls"):
            ImageUrlPolicy.from_setting(wrong)


async def test_off_refuses_every_url(no_connections: list[Any]) -> None:
    error = await refused("https://images.example/cat.png", ImageUrlPolicy(), "image_url_not_allowed")
    assert "router.image_urls" in error.message and "data:" in error.message


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("ftp://images.example/cat.png", "invalid_image_url"),
        ("file:///etc/passwd", "invalid_image_url"),
        ("https://user:secret@images.example/cat.png", "invalid_image_url"),
        ("https://images.example/" + "a" * 8192, "invalid_image_url"),
        ("https:///cat.png", "invalid_image_url"),
    ],
)
async def test_only_plain_http_urls_are_fetched(url: str, code: str, no_connections: list[Any]) -> None:
    await refused(url, ImageUrlPolicy(mode="public"), code)


# -- a listed host ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ok.png", "/chunked.png"])
async def test_a_listed_host_gives_its_image(server: Server, path: str) -> None:
    image = await fetch_image(server.origin + path, param=PARAM, policy=listed(server.origin), bounds=BOUNDS)
    assert (image.width, image.height, image.media_type) == (*PNG_SIZE, "image/png")
    assert image.data == png()
    request = server.requests[0]
    assert request["host"] == f"127.0.0.1:{server.port}"
    assert request["accept"] == "image/*"
    assert request["user-agent"] == "Switchboard-image-fetch"
    assert request["connection"] == "close"
    assert "cookie" not in request and "authorization" not in request


async def test_a_host_not_listed_is_refused(server: Server, no_connections: list[Any]) -> None:
    policy = listed(server.origin)
    await refused(f"https://127.0.0.1:{server.port}/ok.png", policy, "image_url_not_allowed")  # scheme
    await refused(f"http://127.0.0.1:{server.port + 1}/ok.png", policy, "image_url_not_allowed")  # port
    error = await refused("http://other.example/ok.png", policy, "image_url_not_allowed")
    assert "other.example" in error.message


async def test_a_listed_metadata_address_is_refused_unasked(no_connections: list[Any]) -> None:
    policy = listed("http://169.254.169.254", "http://[fd00:ec2::254]", "http://metadata.google.internal")
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://Metadata.Google.Internal./computeMetadata/v1/",
    ):
        error = await refused(url, policy, "image_url_not_allowed")
        assert "metadata" in error.message
    assert no_connections == []


# -- "public" ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x.png",
        "http://10.1.2.3/x.png",
        "http://192.168.0.1/x.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.100.100.200/x.png",
        "http://[::1]/x.png",
        "http://[::ffff:127.0.0.1]/x.png",
        "http://0.0.0.0/x.png",
        "http://2130706433/x.png",  # 127.0.0.1 written as a number
        "http://localhost/x.png",
        "http://metadata/computeMetadata/v1/",
    ],
)
async def test_public_refuses_whatever_is_inside_the_network(url: str, no_connections: list[Any]) -> None:
    await refused(url, PUBLIC, "image_url_not_allowed")


async def test_public_refuses_a_name_with_any_private_address(
    monkeypatch: pytest.MonkeyPatch, no_connections: list[Any]
) -> None:
    fake_resolver(monkeypatch, lambda _: ["93.184.216.34", "10.0.0.5"])
    error = await refused("https://mixed.example/x.png", PUBLIC, "image_url_not_allowed")
    assert "mixed.example" in error.message


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700::1111", True),
        ("::ffff:8.8.8.8", True),  # mapped: judged as the IPv4 host it is
        ("64:ff9b::808:808", True),  # NAT64 to a public host
        ("127.0.0.1", False),
        ("10.0.0.1", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.1.1", False),
        ("100.64.0.1", False),
        ("224.0.0.1", False),
        ("240.0.0.1", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("::", False),
        ("fc00::1", False),
        ("fe80::1", False),
        ("fec0::1", False),
        ("ff02::1", False),
        ("::ffff:10.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("2002:a00:1::", False),  # 6to4 to 10.0.0.1
        ("64:ff9b::a00:1", False),  # NAT64 to 10.0.0.1
        ("64:ff9b:1::a00:1", False),  # local-use NAT64
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False),  # Teredo
    ],
)
def test_public_means_on_the_internet(address: str, public: bool) -> None:
    assert _is_public(ipaddress.ip_address(address)) is public


# -- redirects --------------------------------------------------------------------------------------


async def test_a_redirect_is_followed_and_judged_anew(server: Server) -> None:
    url = f"{server.origin}/redirect?to=/ok.png"
    image = await fetch_image(url, param=PARAM, policy=listed(server.origin), bounds=BOUNDS)
    assert (image.width, image.height) == PNG_SIZE
    assert [request["path"] for request in server.requests] == ["/redirect?to=/ok.png", "/ok.png"]


@pytest.mark.parametrize(
    ("location", "said"),
    [("http://other.example/ok.png", "other.example"), ("http://169.254.169.254/latest/", "metadata")],
)
async def test_a_redirect_out_of_bounds_is_refused(server: Server, location: str, said: str) -> None:
    # The metadata address is listed too: it is refused as metadata, not as a host not listed.
    policy = listed(server.origin, "http://169.254.169.254")
    error = await refused(f"{server.origin}/redirect?to={location}", policy, "image_url_not_allowed")
    assert said in error.message
    assert len(server.requests) == 1


async def test_a_redirect_loop_ends(server: Server) -> None:
    error = await refused(
        f"{server.origin}/loop", listed(server.origin, max_redirects=3), "image_fetch_failed"
    )
    assert "redirects more than 3" in error.message
    assert len(server.requests) == 4


def test_a_redirect_from_https_to_http_is_refused() -> None:
    assert _next_url("http://a.example/x/y.png", "../z.png", param=PARAM) == "http://a.example/z.png"
    assert _next_url("https://a.example/x", "//b.example/y", param=PARAM) == "https://b.example/y"
    with pytest.raises(InvalidRequestError) as caught:
        _next_url("https://a.example/x.png", "http://a.example/x.png", param=PARAM)
    assert (caught.value.code, caught.value.param) == ("image_url_not_allowed", PARAM)


# -- DNS rebinding ----------------------------------------------------------------------------------


async def test_the_name_is_resolved_once_and_its_address_is_connected_to(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rebinding resolver: the loopback address first, the metadata service after. `.invalid`
    # resolves nowhere, so the fetch succeeding proves the connection went to the address checked.
    resolver = fake_resolver(monkeypatch, lambda n: ["127.0.0.1"] if n in (1, 2) else ["169.254.169.254"])
    origin = f"http://images.invalid:{server.port}"
    image = await fetch_image(
        f"{origin}/redirect?to={origin}/ok.png", param=PARAM, policy=listed(origin), bounds=BOUNDS
    )
    assert (image.width, image.height) == PNG_SIZE
    assert resolver.calls == ["images.invalid", "images.invalid"]  # type: ignore[attr-defined]
    assert [request["host"] for request in server.requests] == [f"images.invalid:{server.port}"] * 2


async def test_a_rebinding_to_metadata_on_the_next_hop_is_refused(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolver = fake_resolver(monkeypatch, lambda n: ["127.0.0.1"] if n == 1 else ["169.254.169.254"])
    origin = f"http://images.invalid:{server.port}"
    error = await refused(f"{origin}/redirect?to={origin}/ok.png", listed(origin), "image_url_not_allowed")
    assert "metadata" in error.message
    assert len(resolver.calls) == 2  # type: ignore[attr-defined]
    assert len(server.requests) == 1


# -- time and bytes ---------------------------------------------------------------------------------


async def test_a_server_that_never_answers_times_out(server: Server) -> None:
    policy = listed(server.origin, total_timeout_s=0.3)
    started = time.monotonic()
    error = await refused(f"{server.origin}/silent", policy, "image_fetch_timeout")
    assert 0.25 < time.monotonic() - started < 1.5
    assert "0.3 s" in error.message


async def test_a_host_that_does_not_accept_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hangs(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(10)

    # A connect that hangs (what a host dropping SYNs looks like), with the total deadline far off.
    monkeypatch.setattr(asyncio, "open_connection", hangs)
    policy = listed("http://127.0.0.1:9", connect_timeout_s=0.2, total_timeout_s=5.0)
    started = time.monotonic()
    error = await refused("http://127.0.0.1:9/x.png", policy, "image_fetch_timeout")
    assert time.monotonic() - started < 1.0
    assert "127.0.0.1" in error.message


@pytest.mark.parametrize("path", ["/big", "/chunked-big"])
async def test_a_body_past_the_bound_is_refused(server: Server, path: str) -> None:
    error = await refused(server.origin + path, listed(server.origin), "image_too_large")
    assert "65,536" in error.message


async def test_an_error_status_is_refused_by_name(server: Server) -> None:
    error = await refused(f"{server.origin}/missing.png", listed(server.origin), "image_fetch_failed")
    assert "404" in error.message


async def test_a_closed_port_is_refused() -> None:
    with socket.socket() as unused:  # a port bound and never listened on refuses connections
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        await refused(
            f"http://127.0.0.1:{port}/x.png", listed(f"http://127.0.0.1:{port}"), "image_fetch_failed"
        )


async def test_bytes_that_are_no_image_are_refused_whatever_their_type(server: Server) -> None:
    await refused(f"{server.origin}/text", listed(server.origin), "invalid_image")

"""`switchboard up | router | worker | models | routes | pipelines | adapters | keys | shadow-answers |
make-demo-model`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from switchboard import keys
from switchboard.cli import adapters as adapter_commands
from switchboard.cli import keys as key_commands
from switchboard.cli import pipelines as pipeline_commands
from switchboard.cli import routes as route_commands
from switchboard.cli import shadow as shadow_commands
from switchboard.config import ConfigError, Settings, load_settings
from switchboard.logs import LOG_LABEL_ENV, configure_logging

logger = logging.getLogger(__name__)

DEFAULT_LOG_DIR = "~/.cache/switchboard/logs"
# The admin key `switchboard models` sends when --key is not given.
ADMIN_KEY_ENV = "SWITCHBOARD_ADMIN_KEY"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard", description="Multi-model OpenAI-compatible LLM router."
    )
    parser.add_argument(
        "--config", type=Path, help="TOML configuration file (environment variables override it)"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    verbose_help = "keep everything on the terminal, Triton's and vLLM's output included (no log files)"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    # Also accepted after the command (`switchboard up --verbose`); SUPPRESS leaves the global one alone.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser(
        "up",
        parents=[verbose],
        help="all-in-one local stack: Redis (unless REDIS_URL), the front door, workers",
    )
    up.add_argument("--port", type=int, help="front door port (default 8000)")
    up.add_argument(
        "--host",
        help="front door address (default 127.0.0.1; beyond loopback it needs an API key, see `keys`)",
    )
    up.add_argument("--workers", type=_positive_int, default=1, help="worker processes to start (default 1)")
    up.add_argument(
        "--log-dir",
        type=Path,
        default=Path(DEFAULT_LOG_DIR),
        help=f"folder for worker.log (worker-N.log) and router.log (default {DEFAULT_LOG_DIR})",
    )

    log_file_help = "write all output here (Triton's, vLLM's, child processes'); the terminal shows a summary"
    router = commands.add_parser("router", parents=[verbose], help="run the front door")
    router.add_argument(
        "--host", help="address to listen on (default 127.0.0.1; beyond loopback it needs an API key)"
    )
    router.add_argument("--port", type=int, help="port to listen on (default 8000)")
    router.add_argument("--log-file", type=Path, help=log_file_help)

    worker = commands.add_parser("worker", parents=[verbose], help="run one worker process")
    worker.add_argument("--model", action="append", dest="models", help="serve this model (repeatable)")
    worker.add_argument("--log-file", type=Path, help=log_file_help)

    models = commands.add_parser(
        "models",
        help="show each model's state (loaded where, queued jobs); `models load|unload|prefetch NAME` asks for one",
    )
    models.add_argument(
        "action", nargs="?", choices=("load", "unload", "prefetch"), help="ask the workers first"
    )
    models.add_argument("name", nargs="?", help="the model to load, unload, or fetch into every node cache")
    models.add_argument("--url", help="the front door (default http://127.0.0.1:<router.port>)")
    models.add_argument("--key", help=f"an admin API key, needed once keys exist (default: ${ADMIN_KEY_ENV})")

    route_commands.add_parser(commands)
    pipeline_commands.add_parser(commands)
    adapter_commands.add_parser(commands)
    key_commands.add_parser(commands)
    shadow_commands.add_parser(commands)

    demo = commands.add_parser("make-demo-model", help="build the tiny demo model into a folder")
    demo.add_argument("directory", type=Path)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as the subcommands read it."""
    return _parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the process exit code."""
    args = parse_args(argv)
    log_file = None if args.verbose else getattr(args, "log_file", None)
    component = os.environ.get(LOG_LABEL_ENV) or args.command
    configure_logging(args.log_level, component=component, log_file=log_file)
    if args.command == "make-demo-model":
        return _make_demo_model(args.directory)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        if log_file is not None:
            logger.error("%s", exc)  # the terminal shows it; stderr is the log file now
        else:
            print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    _apply_flags(settings, args)
    # Every key this process makes, whatever the command, goes under the configured prefix; the
    # processes `up` starts are commands of their own, which set theirs the same way.
    keys.set_prefix(settings.redis.key_prefix)
    if args.command == "models":
        from switchboard.cli.models import show_models

        url = args.url or f"http://127.0.0.1:{settings.router.port}"
        if args.action and not args.name:
            raise SystemExit(f"switchboard: `models {args.action}` needs the model's name")
        action = (args.action, args.name) if args.action else None
        return int(show_models(url, api_key=args.key or os.environ.get(ADMIN_KEY_ENV), action=action))
    if args.command == "routes":
        url = args.url or f"http://127.0.0.1:{settings.router.port}"
        return route_commands.run(args, url, args.key or os.environ.get(ADMIN_KEY_ENV))
    if args.command == "pipelines":
        url = args.url or f"http://127.0.0.1:{settings.router.port}"
        return pipeline_commands.run(args, url, args.key or os.environ.get(ADMIN_KEY_ENV))
    if args.command == "adapters":
        url = args.url or f"http://127.0.0.1:{settings.router.port}"
        return adapter_commands.run(args, url, args.key or os.environ.get(ADMIN_KEY_ENV))
    if args.command == "keys":
        return key_commands.run(args, settings)
    if args.command == "shadow-answers":
        return shadow_commands.run(args, settings)
    if args.command == "up":
        from switchboard.local.stack import run_stack

        return run_stack(
            settings,
            config_path=args.config,
            log_level=args.log_level,
            workers=args.workers,
            log_dir=args.log_dir,
            verbose=args.verbose,
        )
    return _run_component(args.command, settings)


def _run_component(command: str, settings: Settings) -> int:
    """`router` or `worker`; an error that ends it is logged, so that it also reaches the terminal.

    A worker's process ends as soon as it has stopped (`workers.runtime.process_exit`)."""
    code = _run_until_stopped(command, settings)
    if command == "worker":
        from workers.runtime.process_exit import exit_at_once

        exit_at_once(code)
    return code


def _run_until_stopped(command: str, settings: Settings) -> int:
    try:
        if command == "router":
            from router.server import serve

            serve(settings)
        else:
            from workers.main import run_worker

            run_worker(settings)
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    except Exception:
        logger.exception("the %s stopped on an error", command)
        return 1
    return 0


def _apply_flags(settings: Settings, args: argparse.Namespace) -> None:
    if getattr(args, "port", None) is not None:
        settings.router.port = args.port
    if getattr(args, "host", None):
        settings.router.host = args.host
    if getattr(args, "models", None):
        unknown = sorted(set(args.models) - {m.name for m in settings.models})
        if unknown:
            raise SystemExit(f"switchboard: --model names unknown models: {', '.join(unknown)}")
        settings.worker.models = args.models


def _make_demo_model(directory: Path) -> int:
    from switchboard.local.demo_model import build_demo_model

    path = build_demo_model(directory, progress=lambda step: print(f"  {step}", flush=True))
    print(f"demo model ready in {path}")
    return 0

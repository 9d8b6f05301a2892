"""`switchboard up | router | worker | make-demo-model`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from switchboard.config import ConfigError, Settings, load_settings
from switchboard.logs import configure_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard", description="Multi-model OpenAI-compatible LLM router."
    )
    parser.add_argument(
        "--config", type=Path, help="TOML configuration file (environment variables override it)"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "up", help="all-in-one local stack: Redis (unless REDIS_URL), front door, one worker"
    )
    up.add_argument("--port", type=int, help="front door port (default 8000)")
    router = commands.add_parser("router", help="run the front door")
    router.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    router.add_argument("--port", type=int, help="port to listen on (default 8000)")
    worker = commands.add_parser("worker", help="run one worker process")
    worker.add_argument("--model", action="append", dest="models", help="serve this model (repeatable)")
    demo = commands.add_parser("make-demo-model", help="build the tiny demo model into a folder")
    demo.add_argument("directory", type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the process exit code."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, component=args.command)
    if args.command == "make-demo-model":
        return _make_demo_model(args.directory)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    _apply_flags(settings, args)
    if args.command == "router":
        from router.server import serve

        serve(settings)
    elif args.command == "worker":
        from workers.main import run_worker

        run_worker(settings)
    elif args.command == "up":
        from switchboard.stack import run_stack

        return run_stack(settings, config_path=args.config, log_level=args.log_level)
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
    from switchboard.demo_model import build_demo_model

    path = build_demo_model(directory, progress=lambda step: print(f"  {step}", flush=True))
    print(f"demo model ready in {path}")
    return 0

"""``worldstream play``: serve the playground (API, WebRTC/WebSocket transports, Gradio page)."""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "play", help="serve the live playground page",
        description="Serve the playground: open http://HOST:PORT in a browser.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="TCP port (default 7860)")
    parser.add_argument("--model", default="builtin",
                        help="world backend: builtin (the trained model) or sim (the "
                             "ground-truth simulator)")
    parser.add_argument("--max-sessions", type=int, default=4,
                        help="sessions served at once; more get 503 (default 4)")
    parser.set_defaults(func=run)


def play_config(max_sessions: int):
    """The engine settings of an interactive session.

    NOTE: every frame generated ahead of the playout clock was conditioned on older keys, so
    the engine's look-ahead adds straight to action-to-photon latency: keep one chunk of
    slack (the smallest buffer the engine accepts), not the default two."""
    from engine.config import EngineConfig

    return EngineConfig(max_sessions=max_sessions, buffer_max_frames=4, batch_join_frames=0)


def run(args: argparse.Namespace) -> int:
    """Load the backend, start the engine, serve until interrupted. Raises FileNotFoundError
    (missing weights, with a hint) and ValueError (bad arguments) for the CLI to report."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.max_sessions < 1:
        raise ValueError(f"--max-sessions must be >= 1, got {args.max_sessions}")
    import uvicorn

    from app.server import create_app
    from engine.engine import Engine
    from engine.registry import BackendUnavailableError, load_backend
    from streaming.limits import Limits

    try:
        backend = load_backend(args.model)
    except BackendUnavailableError as err:
        raise FileNotFoundError(
            f"{err}\nto play without the trained model, stream the ground-truth simulator: "
            f"`worldstream play --model sim`") from None
    engine = Engine(backend, play_config(args.max_sessions)).start()
    try:
        app = create_app(engine, Limits(max_sessions=args.max_sessions))
        print(f"worldstream: serving {args.model!r} on http://{args.host}:{args.port}", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        engine.stop()
    return 0

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
    parser.add_argument("--model-path", default=None,
                        help="model folder (wan-causal: the diffusers-format Wan2.1-T2V-1.3B "
                             "base plus the causal checkpoint; builtin: default assets/builtin)")
    parser.add_argument("--checkpoint", default=None,
                        help="wan-causal: the causal checkpoint file (default DIR/causal.*)")
    parser.add_argument("--max-sessions", type=int, default=4,
                        help="sessions served at once; more get 503 (default 4)")
    parser.add_argument("--mode", choices=("responsive", "quality"), default="responsive",
                        help="starting mode of each session (the page can switch): responsive "
                             "= 1-frame chunks at 2 steps, quality = 2-frame chunks (where the "
                             "model has them) at 4 steps (default responsive)")
    parser.set_defaults(func=run)


def play_config(max_sessions: int, mode: str = "responsive"):
    """The engine settings of an interactive session: chunks start just in time for their
    playout deadline (``EngineConfig.jit_margin_ms``), so no frame is generated ahead on older
    keys; ``mode`` is the sessions' starting mode (``engine.config.MODES``)."""
    from engine.config import EngineConfig

    return EngineConfig(max_sessions=max_sessions, mode=mode)


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

    kwargs = {}
    if args.model == "sim" and (args.model_path or args.checkpoint):
        raise ValueError("--model sim takes no --model-path or --checkpoint")
    if args.model_path is not None:
        kwargs["model_path" if args.model == "wan-causal" else "path"] = args.model_path
    if args.checkpoint is not None:
        kwargs["checkpoint"] = args.checkpoint
    try:
        backend = load_backend(args.model, **kwargs)
    except BackendUnavailableError as err:
        raise FileNotFoundError(
            f"{err}\nto play without the trained model, stream the ground-truth simulator: "
            f"`worldstream play --model sim`") from None
    # the scene-prompt encoder loads in seconds on an idle machine but far longer under load:
    # load it before serving, so the first session does not stall
    from engine.text import scene_for_prompt

    scene_for_prompt("warm-up")
    engine = Engine(backend, play_config(args.max_sessions, args.mode)).start()
    try:
        app = create_app(engine, Limits(max_sessions=args.max_sessions))
        print(f"worldstream: serving {args.model!r} on http://{args.host}:{args.port}", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        engine.stop()
    return 0

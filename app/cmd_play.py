"""``worldstream play``: serve the playground (API, WebRTC/WebSocket transports, Gradio page)."""

from __future__ import annotations

import argparse
import os
import socket

from worldstream.app import game_args, settings_cli

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "play", help="serve the live playground page",
        description="Serve the playground: open http://HOST:PORT in a browser.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="TCP port (default 7860)")
    parser.add_argument("--world", choices=game_args.world_choices(), default=None,
                        help="the world: the top-down landscape (default), the avatar (a "
                             "character steered by expression, gaze and speech), or a named "
                             "game (pong, breakout)")
    parser.add_argument("--model", choices=game_args.model_choices(), default=None,
                        help=game_args.model_help())
    parser.add_argument("--variant", choices=game_args.variant_choices(), default=None,
                        help="the variant of a model that has them (its default without)")
    game_args.add_arguments(parser)
    parser.add_argument("--model-path", default=None,
                        help="model folder, for a model that takes one (a world's trained "
                             "model: default the world's assets; a game (--env): a folder "
                             "of `worldstream train`)")
    parser.add_argument("--frame-size", choices=game_args.frame_size_choices(), default=None,
                        help="the frame size of a model that takes one (the emulated GPU "
                             "model: default 128x128; 832x480 is Wan2.1's)")
    settings_cli.add_arguments(parser)
    parser.add_argument("--max-sessions", type=int, default=4,
                        help="sessions served at once; more get 503 (default 4)")
    parser.add_argument("--mode", choices=("responsive", "quality"), default="responsive",
                        help="starting mode of each session (the page can switch): responsive "
                             "= 1-frame chunks at 2 steps, quality = 2-frame chunks (where the "
                             "model has them) at 4 steps (default responsive)")
    scale = parser.add_argument_group(
        "scale-out on Ray", "engine replicas in processes of their own (README, 'Scale-out')")
    scale.add_argument("--replicas", type=_replica_range, default=None, metavar="N|MIN-MAX",
                       help="start N engine replicas on Ray, or MIN and autoscale up to MAX "
                            "with the sessions (default: one engine in this process, no Ray)")
    scale.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="join this Ray cluster (e.g. one started with `ray start --head`); "
                            "default: a local Ray started in-process")
    scale.add_argument("--replica-resources", type=_resources, default=(1.0, 0.0),
                       metavar="CPUS[,GPUS]",
                       help="Ray num_cpus and num_gpus of one replica (default 1,0)")
    scale.add_argument("--media-from", choices=("front", "replica"), default=None,
                       help="who sends a session's WebRTC media: the replica that generates "
                            "it, from its own host (the default with --replicas: this process "
                            "only relays offers; clients must reach the replicas' hosts over "
                            "UDP; after a failover the page makes a new offer and plays on) "
                            "or this front end (every frame crosses to it and is encoded "
                            "here; for clients that can reach only this host)")
    exposed = parser.add_argument_group(
        "serving other people", "see README, 'Serving other people'")
    exposed.add_argument("--auth", action="store_true",
                         help="require a server key to create sessions and read metrics: the "
                              "key is read from $WORLDSTREAM_KEY (or a fresh one is printed); "
                              "open the page as http://HOST:PORT/?key=KEY")
    exposed.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                         help="a host name users reach the server by (repeatable); the Host "
                              "header must be one of them (default: the bind address; "
                              "localhost names on loopback)")
    exposed.add_argument("--allowed-origin", action="append", default=[], metavar="URL",
                         help="another web origin allowed to call the API (repeatable), e.g. "
                              "https://play.example.com behind a TLS proxy")
    exposed.add_argument("--sessions-per-client", type=int, default=None, metavar="N",
                         help="sessions one client address may hold (default: half of "
                              "--max-sessions with --auth or a non-loopback --host, else no "
                              "limit)")
    parser.set_defaults(func=run)


def _resources(text: str) -> tuple[float, float]:
    """``--replica-resources``: ``CPUS`` or ``CPUS,GPUS``, each >= 0."""
    cpus, _, gpus = text.partition(",")
    try:
        value = float(cpus), float(gpus or 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPUS[,GPUS], got {text!r}") from None
    if min(value) < 0:
        raise argparse.ArgumentTypeError(f"resources must be >= 0, got {text!r}")
    return value


def _replica_range(text: str) -> tuple[int, int]:
    """``--replicas``: ``N`` (a fixed count) or ``MIN-MAX`` (autoscaled), both >= 1."""
    low, _, high = text.partition("-")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN-MAX, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def _ray_engine(args: argparse.Namespace, name: str, model_kwargs: dict):
    """Engine replicas on Ray (``engine.cluster``); each replica admits ``--max-sessions``."""
    from worldstream.engine.cluster.router import RayEngine

    low, high = args.replicas
    extra: dict = {}
    if args.media_from == "replica":  # the replicas send their sessions' media themselves
        from worldstream.streaming.limits import Limits
        from worldstream.streaming.replica_media import MediaReplica

        # NOTE: a Ray started here (no --ray-address) listens on loopback only
        # (engine.cluster.pool.init_ray): the replicas' media listen where the page is served
        media_host = None if args.ray_address is not None else media_bind_address(args.host)
        extra = {"replica_cls": MediaReplica,
                 "replica_kwargs": {"limits": Limits(max_sessions=args.max_sessions),
                                    "media_host": media_host}}
    return RayEngine(name, replicas=low, min_replicas=low, max_replicas=high,
                     address=args.ray_address,
                     config=play_config(args.max_sessions, args.mode), model_kwargs=model_kwargs,
                     replica_cpus=args.replica_resources[0],
                     replica_gpus=args.replica_resources[1], **extra).start()


def media_bind_address(host: str) -> str:
    """Where the media of replicas on this host listen for a front end bound to ``host``: the
    same address (``localhost``: 127.0.0.1); for a wildcard (``0.0.0.0``, ``::``) the
    address this host reaches the network by, which clients can be sent to."""
    if host == "localhost":
        return "127.0.0.1"
    if host not in ("0.0.0.0", "::", ""):
        return host.strip("[]")
    family = socket.AF_INET6 if host == "::" else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:  # no packet is sent: the route's source address is the answer
            probe.connect(("2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1", 9))
            return probe.getsockname()[0]
        except OSError:  # no route: only this machine can reach it anyway
            return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def media_from(args: argparse.Namespace) -> str:
    """``--media-from``: as given, else ``replica`` with ``--replicas`` (the page offers again
    after a failover: ``app/static/reconnect.js``) and ``front`` without. ValueError for
    ``replica`` without ``--replicas``."""
    if args.media_from == "replica" and args.replicas is None:
        raise ValueError("--media-from replica goes with --replicas")
    if args.media_from is not None:
        return args.media_from
    return "front" if args.replicas is None else "replica"


def access_settings(args: argparse.Namespace):
    """The access policy and per-client limit of ``play``'s arguments (``app.access``)."""
    import secrets

    from worldstream.app.access import AccessPolicy, is_loopback

    key = None
    if args.auth:
        key = os.environ.get("WORLDSTREAM_KEY") or secrets.token_urlsafe(24)
        if "WORLDSTREAM_KEY" not in os.environ:
            print(f"worldstream: server key (set WORLDSTREAM_KEY to choose it): {key}",
                  flush=True)
    policy = AccessPolicy.for_bind(args.host, key, tuple(args.allowed_host),
                                   tuple(args.allowed_origin))
    per_client = args.sessions_per_client
    # exposed (a key, or a public bind address): no one address takes every slot. Behind a
    # reverse proxy on loopback the address is the proxy's unless it sends X-Forwarded-For
    # (uvicorn trusts it from 127.0.0.1), see README "Serving other people"
    if per_client is None and (args.auth or not is_loopback(args.host)):
        per_client = max(1, args.max_sessions // 2)
    if per_client is not None and per_client < 1:
        raise ValueError(f"--sessions-per-client must be >= 1, got {per_client}")
    return policy, per_client


def _without_weights(err: Exception, args: argparse.Namespace, choice) -> str:
    """The error of a model that cannot load, with the way to play its world's simulator
    instead where there is one (its family's rows say: ``simulator``)."""
    from worldstream.engine.core import registry

    family = choice.family
    if family.simulator or family.own_world:
        return str(err)
    sim = registry.env_default_model(False) if choice.env is not None else \
        registry.simulator_model(choice.world)
    if sim is None:
        return str(err)
    where = f"--env {choice.env}" if args.env is not None else f"--world {args.world}"
    return (f"{err}\nto play without the trained model, stream the ground-truth simulator: "
            f"`worldstream play {where} --model {sim}`")


def play_config(max_sessions: int, mode: str = "responsive"):
    """The engine settings of an interactive session: chunks start just in time for their
    playout deadline (``EngineConfig.jit_margin_ms``), so no frame is generated ahead on older
    keys; ``mode`` is the sessions' starting mode (``engine.core.config.MODES``)."""
    from worldstream.engine.core.config import EngineConfig

    return EngineConfig(max_sessions=max_sessions, mode=mode)


def run(args: argparse.Namespace) -> int:
    """Load the backend, start the engine, serve until interrupted. Raises FileNotFoundError
    (missing weights, with a hint) and ValueError (bad arguments) for the CLI to report."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.max_sessions < 1:
        raise ValueError(f"--max-sessions must be >= 1, got {args.max_sessions}")
    import uvicorn

    from worldstream.app.server import create_app
    from worldstream.app.startup import startup_line
    from worldstream.engine.core.backend import backend_info
    from worldstream.engine.core.engine import Engine
    from worldstream.engine.core.registry import BackendUnavailableError, load_backend
    from worldstream.streaming.limits import Limits
    from worldstream.streaming.webrtc import bind_media, configure_ice_consent

    choice = game_args.resolve(args)  # ValueError
    family = choice.family
    args.world, args.model = choice.world, choice.model
    if settings_cli.wants_help(args):
        return settings_cli.print_family_settings(family, args.world, args.model_path,
                                                  dict(family.play_settings))
    name = choice.backend
    if not family.replicas and args.replicas is not None:
        raise ValueError(f"--world {args.world} runs in one process (no --replicas)")
    args.media_from = media_from(args)
    kwargs = {"model_path": args.model_path, **game_args.backend_kwargs(args, choice)}
    if args.variant is not None:
        if not family.variants:
            raise ValueError(f"--variant goes with --model {game_args.models_with('variants')}")
        kwargs[family.keyed or "variant"] = args.variant
    # the row's serving settings (e.g. compiled at start-up), then --set (ValueError for a
    # family that takes none)
    kwargs.update({**dict(family.play_settings), **settings_cli.family_overrides(family, args)})
    if args.frame_size is not None:
        if args.frame_size not in family.frame_sizes:
            raise ValueError("--frame-size goes with --model "
                             f"{game_args.models_with('frame_sizes')}")
        kwargs["frame_size"] = args.frame_size
    policy, per_client = access_settings(args)
    if args.replicas is not None:
        engine = _ray_engine(args, name, kwargs)
    else:
        try:
            backend = load_backend(name, **kwargs)
        except BackendUnavailableError as err:
            raise FileNotFoundError(_without_weights(err, args, choice)) from None
        if family.prompt_encoder:
            # the scene-prompt encoder loads in seconds on an idle machine but far longer
            # under load: load it before serving, so the first session does not stall
            from worldstream.engine.models.builtin.text import scene_for_prompt

            scene_for_prompt("warm-up")
        config = play_config(args.max_sessions, args.mode)
        # a model of large chunks (Wan, Matrix-Game: 12 frames) needs a buffer that holds one
        config.buffer_max_frames = max(config.buffer_max_frames,
                                       max(backend_info(backend).supported_chunk_frames)
                                       + config.batch_join_frames)
        print(startup_line(args.world, args.model, backend, config), flush=True)
        engine = Engine(backend, config).start()
    bind_media(args.host)  # media sockets where the page is served, not on every interface
    configure_ice_consent()  # a crashed tab's session is noticed in seconds, not half a minute
    try:
        # with replicas, each admits --max-sessions: the front end admits them all
        app = create_app(engine, Limits(max_sessions=engine.capacity,
                                        sessions_per_client=per_client), access=policy)
        print(f"worldstream: serving {args.world} with {args.model!r} on "
              f"http://{args.host}:{args.port}", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        engine.stop()
    return 0

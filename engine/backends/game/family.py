"""The game family's rows, ``NAME:ENV`` (ENV: a Gymnasium id or ``module:factory``): the game
itself and its learned world, each playing the named game worlds. Both declare their own keys
and run in one process (no replicas)."""

from worldstream.engine.core.family import Family

#: the named game worlds (``--world NAME``) and their env
NAMED_WORLDS = (("pong", "ALE/Pong-v5"), ("breakout", "ALE/Breakout-v5"))

FAMILIES = (
    Family("game-sim", "worldstream.engine.backends.game.sim:load_game_backend", keyed="env",
           model="sim", worlds=tuple(w for w, _ in NAMED_WORLDS), world_keys=NAMED_WORLDS,
           summary="the game itself; the default with --env alone",
           simulator=True, own_keys=True, replicas=False),
    Family("game-builtin", "worldstream.engine.backends.game.world:load_game_world_backend",
           keyed="env", model="builtin", worlds=tuple(w for w, _ in NAMED_WORLDS),
           world_keys=NAMED_WORLDS, path_argument="path",
           summary="its learned world (a folder of `worldstream train`); the default with "
                   "--model-path",
           default=True, own_keys=True, replicas=False,
           hint="train with `worldstream train --env {env} --out {folder}`"),
)

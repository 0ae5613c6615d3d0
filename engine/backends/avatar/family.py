"""The avatar family's rows: its learned world (a built-in model: the built-in ``--set``
settings) and its simulator. Both run in one process (no replicas)."""

from worldstream.engine.backends.builtin.family import SETTINGS, SETTINGS_SOURCE
from worldstream.engine.core.family import Family

FAMILIES = (
    Family("avatar", "worldstream.engine.backends.avatar.backend:load_avatar_backend",
           model="builtin", worlds=("avatar",), path_argument="path",
           summary="the world's trained model; the default",
           settings=SETTINGS, settings_source=SETTINGS_SOURCE, play_settings=(("compile", True),),
           default=True, prompt_encoder=True, replicas=False,
           hint="train them with `worldstream train-ae --world avatar` and `worldstream "
                "train-world --world avatar`, or restore the shipped assets/avatar from git"),
    Family("avatar-sim", "worldstream.engine.backends.avatar.sim:AvatarSimBackend",
           model="sim", worlds=("avatar",), summary="the world's ground-truth simulator",
           simulator=True, prompt_encoder=True, replicas=False),
)

"""The built-in family's row (``engine.core.family.Family``): the landscape's trained model."""

from worldstream.engine.core.family import Family

#: ``--set`` of a built-in model: its stream settings, and the values ``--set help`` shows
SETTINGS = "worldstream.engine.backends.builtin.config:BuiltinConfig"
SETTINGS_SOURCE = "worldstream.engine.backends.builtin.settings_source:settings_source"

FAMILIES = (
    Family("builtin", "worldstream.engine.backends.builtin.load:load_builtin_backend",
           model="builtin", worlds=("landscape",), path_argument="path",
           summary="the world's trained model; the default",
           settings=SETTINGS, settings_source=SETTINGS_SOURCE,
           # compiled at start-up (BuiltinConfig.compile); --set compile=false skips it
           play_settings=(("compile", True),),
           default=True, prompt_encoder=True,
           hint="train them with `worldstream train-ae` and `worldstream train-world`, or "
                "restore the shipped assets/builtin from git"),
)

"""The Matrix-Game 2.0 family's row (keys and mouse, GPU): a world of its own (a picture it
starts from); input logs record its variant, ``NAME:VARIANT`` (``load_backend`` takes that id,
or ``variant=``)."""

from worldstream.engine.core.family import Family

FAMILIES = (
    Family("matrix-game-2",
           "worldstream.engine.backends.matrix_game.backend:load_matrix_game_backend",
           model="matrix-game-2", keyed="variant", key_optional=True,
           variants=("universal", "gta_drive", "templerun"), path_argument="model_path",
           summary="Matrix-Game 2.0 on a GPU, steered by keys and mouse; a world of its own, "
                   "with --model-path and --variant (universal: WASD + mouse look, the "
                   "default; gta_drive: W/S + A/D steering; templerun)",
           own_keys=True,
           hint="pass --model-path DIR holding the Skywork/Matrix-Game-2.0 release "
                "(base_distilled_model/, gta_distilled_model/, templerun_distilled_model/, "
                "Wan2.1_VAE.pth, the CLIP .pth)"),
)

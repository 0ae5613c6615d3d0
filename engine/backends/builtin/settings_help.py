"""``--set help`` of a built-in model (the family rows' ``settings_help``): its settings with
a world's values (the assets' ``stream_config.json``) and those the command sets itself."""

from __future__ import annotations

from pathlib import Path


def print_settings_help(world: str, model_path: str | Path | None = None,
                        command_values: dict | None = None) -> int:
    """Print the settings of ``world``'s built-in model (``model_path``: its folder, default
    the world's assets) with ``command_values`` over them (``play`` compiles the model);
    returns 0, the command's exit status."""
    from worldstream.app.settings_cli import Shown, print_settings, shown_path
    from worldstream.engine.backends.builtin.config import BuiltinConfig
    from worldstream.engine.backends.settings import SETTINGS_FILE, load_settings
    from worldstream.engine.worlds.catalog import world as world_spec

    folder = Path(model_path) if model_path else world_spec(world).assets
    values = {**load_settings(BuiltinConfig, folder), **(command_values or {})}
    anchored = values.get("colour_anchor", BuiltinConfig.colour_anchor) is not None
    if "colour_prior" not in values and anchored:  # loaded from a file, not a setting
        from worldstream.engine.models.builtin.colour_prior import FILENAME
        from worldstream.engine.models.builtin.loading import BUILTIN_DIR

        path = folder / FILENAME if (folder / FILENAME).is_file() else BUILTIN_DIR / FILENAME
        values["colour_prior"] = Shown(f"loaded from {shown_path(path)}")
    source = str(folder / SETTINGS_FILE) + (", this command" if command_values else "")
    return print_settings(BuiltinConfig, values, source)

"""What ``--set help`` of a built-in model shows (the family rows' ``settings_source``): its
settings' values for a world (the assets' ``stream_config.json``) and where they come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Shown:
    """A value shown as it reads (not quoted) in a ``--set help`` listing."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def settings_source(world: str, model_path: str | Path | None = None
                    ) -> tuple[dict[str, Any], str]:
    """``(values, source)``: the settings of ``world``'s built-in model in ``model_path`` (its
    folder, default the world's assets), the colour prior shown as the file it loads from, and
    the settings file they come from. ValueError naming a bad settings file."""
    from worldstream.engine.backends.builtin.config import BuiltinConfig
    from worldstream.engine.backends.settings import SETTINGS_FILE, load_settings
    from worldstream.engine.worlds.catalog import world as world_spec

    folder = Path(model_path) if model_path else world_spec(world).assets
    values: dict[str, Any] = load_settings(BuiltinConfig, folder)
    anchored = values.get("colour_anchor", BuiltinConfig.colour_anchor) is not None
    if "colour_prior" not in values and anchored:  # loaded from a file, not a setting
        from worldstream.engine.models.builtin.colour_prior import FILENAME
        from worldstream.engine.models.builtin.loading import BUILTIN_DIR

        path = folder / FILENAME if (folder / FILENAME).is_file() else BUILTIN_DIR / FILENAME
        values["colour_prior"] = Shown(f"loaded from {_shown_path(path)}")
    return values, str(folder / SETTINGS_FILE)


def _shown_path(path: Path) -> str:
    """``path`` relative to the working folder where it lies under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)

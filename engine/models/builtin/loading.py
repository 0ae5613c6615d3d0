"""Loading the shipped built-in model (diffusers ``from_pretrained`` layout under ``assets/``)
with errors that name the missing or corrupt file."""

from __future__ import annotations

from pathlib import Path

from diffusers import AutoencoderTiny
from diffusers.utils import logging as diffusers_logging

from worldstream.engine.models.builtin.colour_prior import FILENAME as COLOUR_PRIOR_FILE
from worldstream.engine.models.builtin.colour_prior import ColourPrior
from worldstream.engine.models.builtin.world_dit import WorldDiT

BUILTIN_DIR = Path(__file__).resolve().parents[3] / "assets" / "builtin"
_WEIGHTS = "diffusion_pytorch_model.safetensors"


def _check(folder: Path) -> None:
    for name in ("config.json", _WEIGHTS):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"model file missing: {folder / name} (train it with `worldstream train-ae` / "
                "`worldstream train-world`, or restore it from git)"
            )


def _load(cls, folder: Path):
    folder = Path(folder)
    _check(folder)
    try:
        # diffusers warns about its own saved config keys and a missing `accelerate`; neither
        # matters for these small models, so keep the user's console clean
        verbosity = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()
        try:
            return cls.from_pretrained(folder, low_cpu_mem_usage=False).eval()
        finally:
            diffusers_logging.set_verbosity(verbosity)
    except Exception as err:  # safetensors/json errors -> name the file
        raise ValueError(f"could not load {cls.__name__} from {folder}: {err}") from err


def load_autoencoder(folder: Path = BUILTIN_DIR / "vae") -> AutoencoderTiny:
    """The built-in autoencoder; FileNotFoundError/ValueError naming the bad file."""
    return _load(AutoencoderTiny, folder)


def load_world_model(folder: Path = BUILTIN_DIR / "transformer") -> WorldDiT:
    """The built-in world transformer; FileNotFoundError/ValueError naming the bad file."""
    return _load(WorldDiT, folder)


def load_colour_prior(folder: Path = BUILTIN_DIR) -> ColourPrior:
    """The landscape's colour prior from ``folder/colour_prior.json``, or the shipped one where
    the folder has none (the prior comes from the simulator, not the weights: a retrained
    model keeps it). FileNotFoundError/ValueError naming a missing or corrupt file."""
    path = Path(folder) / COLOUR_PRIOR_FILE
    return ColourPrior.load(path if path.is_file() else BUILTIN_DIR / COLOUR_PRIOR_FILE)

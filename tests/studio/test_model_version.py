"""A model version names what decides frames, and nothing else: the same weights and settings
give the same version in any process and any checkout, so a save point or an input log made
yesterday loads today."""

import os
import subprocess
import sys

import pytest

from worldstream.engine.studio.savepoint import frame_config

_PRINT_VERSIONS = (
    "from worldstream.engine.core.registry import load_backend\n"
    "from worldstream.engine.studio.savepoint import model_version\n"
    "print(model_version(load_backend('builtin')), model_version(load_backend('avatar')))\n"
)


def _versions(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", _PRINT_VERSIONS], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return out.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_version_is_the_same_in_every_process():
    """diffusers records which config keys it filled with defaults as a set, whose order
    follows the process's hash seed: two seeds must still give one version (they gave two
    before the version ignored that bookkeeping)."""
    first, second = _versions("1"), _versions("2")
    assert first == second and len(first.split()) == 2


def test_theframe_config_drops_bookkeeping_and_retired_keys_at_their_defaults():
    config = {"_class_name": "WorldDiT", "_name_or_path": "/somewhere/transformer",
              "_use_default_values": ["skip_floor", "base_warp"], "_diffusers_version": "0.42",
              "depth": 6, "base_warp": None, "noise_scale": 2.0, "backdrop_fill": False}
    assert frame_config(config) == {"_class_name": "WorldDiT", "depth": 6}
    # a retired key at another value is part of what decides frames: kept, so the version
    # differs from the shipped model's
    assert frame_config({"noise_scale": 1.0}) == {"noise_scale": 1.0}

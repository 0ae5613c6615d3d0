"""A new model family inside the repository is one folder (issues 65, 73): a toy family's
folder (``__init__.py``, ``backend.py``, ``family.py`` with its row) put where
``engine/backends`` looks, found by the shipped families' entry point, played through
``worldstream generate`` and saved and restored through the save-point contract, with no
other edit."""

from __future__ import annotations

import sys
import textwrap

import av
import numpy as np
import pytest

from worldstream.app import cli
from worldstream.engine.core import registry
from worldstream.engine.core.backend import ChunkJob

TOY = textwrap.dedent('''
    """A toy family: frame n of a session is flat grey n * 8 (mod 256), whatever the keys."""
    from dataclasses import dataclass

    import numpy as np

    from worldstream.engine.core.backend import BackendInfo, ChunkJob, ChunkResult


    @dataclass
    class ToyState:
        frame: int = 0


    class ToyBackend:
        name, width, height, default_fps = "toy", 64, 48, 10
        max_states, chunk_frames, rewind_chunks = 8, 2, 4
        imports_off_thread = False

        def info(self):
            return BackendInfo(name=self.name, world="landscape", chunk_frames=2,
                               supported_chunk_frames=(2,))

        def key_action(self, keys):
            return 0

        def new_state(self, prompt, seed):
            return ToyState()

        def set_prompt(self, state, text, blend_text=None, blend_weight=0.0):
            pass

        def fork(self, state):
            return ToyState(state.frame)

        def free(self, state):
            pass

        def rewind(self, state, chunks):
            raise ValueError("no history")

        def generate(self, jobs):
            out = []
            for job in jobs:
                first = job.state.frame
                job.state.frame += job.num_frames
                values = (np.arange(first, job.state.frame) * 8 % 256).astype(np.uint8)
                frames = np.broadcast_to(values[:, None, None, None],
                                         (job.num_frames, self.height, self.width, 3))
                out.append(ChunkResult(np.ascontiguousarray(frames)))
            return out

        # save points (engine.core.backend.SavesState)
        def export_state(self, state):
            return {}, {"frame": state.frame}

        def check_saved(self, scalars, layout):
            pass

        def import_state(self, arrays, scalars):
            return ToyState(int(scalars["frame"]))

        def hash_frames(self, h):
            h.update(b"toy 1")
''')


ROW = textwrap.dedent('''
    from worldstream.engine.core.family import Family

    FAMILIES = (Family("toy", "worldstream.engine.backends.toyfamily.backend:ToyBackend",
                       model="toy", worlds=("landscape",)),)
''')


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy family's folder, as if it were ``engine/backends/toyfamily/`` (the package's
    search path gains ``tmp_path``), and the registry read again; undone after."""
    import worldstream.engine.backends as backends

    folder = tmp_path / "toyfamily"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "backend.py").write_text(TOY)
    (folder / "family.py").write_text(ROW)
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(tmp_path)])
    registry.discover()
    assert registry.PLUGIN_ERRORS == []
    yield
    monkeypatch.undo()
    for name in [m for m in sys.modules if ".toyfamily" in m]:
        del sys.modules[name]
    registry.discover()


def test_a_registered_family_plays_through_generate(toy_family, tmp_path):
    out = tmp_path / "toy.mp4"
    assert cli.main(["generate", "--model", "toy", "--frames", "12", "--fps", "10",
                     "--out", str(out)]) == 0
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 12
    assert frames[0].shape == (48, 64, 3)
    # the toy's grey ramp, frame by frame (H.264 moves a flat grey by a level or two)
    means = np.array([f.mean() for f in frames])
    assert np.abs(means - np.arange(12) * 8).max() < 4


def test_a_registered_family_saves_and_restores_through_the_contract(toy_family):
    from worldstream.engine.studio import savestate

    backend = registry.load_backend("toy")
    state = backend.new_state("x", 0)
    backend.generate([ChunkJob(state, [0, 0], 1)])
    arrays, scalars = savestate.export_state(backend, state)
    restored = savestate.import_state(backend, arrays, scalars)
    assert restored.frame == 2 and restored is not state


def test_a_family_name_or_world_pair_is_registered_once(toy_family):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.Family("toy", "toyfamily.backend:ToyBackend"))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.Family("toy2", "toyfamily.backend:ToyBackend",
                                          model="toy", worlds=("landscape",)))

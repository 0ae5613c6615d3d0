"""A save point is checked completely before it is accepted (issue 74, kind 2): every array of
a built-in state against the shapes, dtypes and ranges declared on its fields, every scalar
against the model, and no NaN in any family's floating-point arrays. Edits of a genuine file
that loaded with 200 and killed the session at its next chunk are refused with a 400 naming
the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.fixtures.builtin import tiny_generator
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.studio import savepoint
from worldstream.engine.studio.savepoint import SavepointError


@pytest.fixture(scope="module")
def genuine():
    """A tiny built-in model and a genuine save file of a state that played 3 chunks."""
    backend = tiny_generator(colour_anchor=2.0)
    state = backend.new_state("a green meadow", 3)
    try:
        for action in (1, 2, 3):
            backend.generate([ChunkJob(state, [action] * backend.chunk_frames, 2)])
            backend.finish()
        arrays, scalars = backend.export_state(state)
    finally:
        backend.free(state)
    meta = {"format": savepoint.SAVEPOINT_FORMAT, "model": backend.name,
            "model_version": savepoint.model_version(backend), "state": scalars,
            "session": {"seed": 3, "prompt": "a green meadow", "action": 0, "frame_index": 6,
                        "chunk_frames": backend.chunk_frames, "steps": 2, "mode": None,
                        "fork_id": 0}}
    return backend, arrays, meta


def _edited(genuine, arrays=None, **scalars) -> bytes:
    _, base_arrays, meta = genuine
    meta = json.loads(json.dumps(meta))
    for path, value in scalars.items():
        *parents, leaf = path.split("__")
        node = meta["state"]
        for p in parents:
            node = node[p]
        node[leaf] = value
    return savepoint.encode({**base_arrays, **(arrays or {})}, meta)


def _nan(array: np.ndarray) -> np.ndarray:
    out = np.array(array, copy=True)
    out.reshape(-1)[0] = np.nan
    return out


def _cases(genuine) -> dict[str, bytes]:
    _, arrays, meta = genuine
    tiles = len(meta["state"]["memory"]["keys"])
    assert tiles > 0
    return {
        # the four edits of the report, each once loaded with 200
        "h0.cam_vel": _edited(genuine, {"h0.cam_vel": np.zeros(5, np.float32)}),
        "mem.": _edited(genuine, {"mem.rgb": np.zeros((tiles, 8, 8, 3), np.uint8),
                                     "mem.epoch": np.zeros((tiles, 8, 8), np.int32),
                                     "mem.view": np.zeros((tiles, 8, 8), np.int16)}),
        "memory.tile": _edited(genuine, memory__tile=4096),
        "window_chunks": _edited(genuine, window_chunks=65536),
        # NaN in the latents, the KV pages and the text embedding
        "h1.latents": _edited(genuine, {"h1.latents": _nan(arrays["h1.latents"])}),
        "kv.k": _edited(genuine, {"kv.k": _nan(arrays["kv.k"])}),
        "text": _edited(genuine, {"text": _nan(arrays["text"])}),
        # variants: a dtype, an array no state has, a camera far outside the world
        "h0.known": _edited(genuine, {"h0.known": arrays["h0.known"].astype(np.float64)}),
        "h0.extra": _edited(genuine, {"h0.extra": np.zeros(2, np.float32)}),
        "h0.cam_pos": _edited(genuine, {"h0.cam_pos": np.full(2, 1e300)}),
        "memory.max_tiles": _edited(genuine, memory__max_tiles=7),
    }


def test_the_genuine_file_loads(genuine):
    backend, arrays, meta = genuine
    got, _ = savepoint.decode(_edited(genuine), backend)
    backend.free(backend.import_state(got, meta["state"]))


def test_every_edit_is_refused_naming_its_field(genuine):
    backend = genuine[0]
    for field, data in _cases(genuine).items():
        with pytest.raises(SavepointError) as err:
            arrays, meta = savepoint.decode(data, backend)
            backend.free(backend.import_state(arrays, meta["state"]))  # as a load does
        message = str(err.value)
        assert field in message and "\n" not in message, (field, message)


def test_the_server_answers_400_and_the_session_plays_on(genuine, tmp_path):
    from worldstream.app.cmd_play import play_config
    from worldstream.app.server import create_app
    from worldstream.engine.core.engine import Engine
    from worldstream.streaming.limits import Limits

    backend = genuine[0]
    cases = _cases(genuine)
    with Engine(backend, play_config(max_sessions=2)) as engine, \
            TestClient(create_app(engine, Limits(max_sessions=2, messages_per_s=100,
                                                 message_burst=100),
                                  ui=False, recording_dir=tmp_path)) as client:
        s = client.post("/api/sessions", json={"prompt": "a green meadow"}).json()
        headers = {"Authorization": f"Bearer {s['token']}",
                   "Content-Type": "application/octet-stream"}
        for field in ("h0.cam_vel", "memory.tile", "window_chunks", "kv.k"):
            r = client.post(f"/api/sessions/{s['session_id']}/state", content=cases[field],
                            headers=headers)
            assert r.status_code == 400, (field, r.text)
            assert r.json()["field"] == "state" and field in r.json()["error"]
        r = client.post(f"/api/sessions/{s['session_id']}/state", content=_edited(genuine),
                        headers=headers)
        assert r.status_code == 200, r.text

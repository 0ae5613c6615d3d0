"""Start from a picture: the upload is centre-cropped and resized (checked on a hand-made
picture), bad uploads get one clear error each and leave the session as it was, and a stream
started from a simulator frame shows that frame first."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from PIL import Image

from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.evaluation.metrics import psnr
from worldstream.engine.studio import worldio
from worldstream.engine.studio.picture import MAX_PICTURE_BYTES, PictureError, fit_picture
from worldstream.engine.worlds.simulator import WorldSimulator


def encoded(rgb: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt)
    return buf.getvalue()


def test_a_wide_picture_is_centre_cropped_then_resized():
    # 200 x 100: red | green | blue columns of 50, 100, 50 px: the centre square is all green
    rgb = np.zeros((100, 200, 3), np.uint8)
    rgb[:, :50] = (255, 0, 0)
    rgb[:, 50:150] = (0, 255, 0)
    rgb[:, 150:] = (0, 0, 255)
    out = fit_picture(encoded(rgb), 64)
    assert out.shape == (64, 64, 3) and out.dtype == np.uint8
    # (Lanczos reads a few source pixels beyond the crop box: the outer columns ring)
    assert np.array_equal(out[:, 4:-4], np.broadcast_to([0, 255, 0], (64, 56, 3)))
    assert out[:, :, 1].min() >= 240 and out[:, :, [0, 2]].max() <= 12
    # a tall one: top and bottom thirds cut; JPEG decodes too
    tall = np.zeros((300, 100, 3), np.uint8)
    tall[100:200] = 200
    out = fit_picture(encoded(tall, "JPEG"), 32)
    assert np.abs(out[2:-2].astype(int) - 200).max() <= 6


@pytest.mark.parametrize(("data", "message"), [
    (b"GIF89a" + bytes(100), "not a PNG or JPEG"),
    (b"", "no picture"),
    (b"\x89PNG\r\n\x1a\n" + bytes(MAX_PICTURE_BYTES), "the limit is"),
    (encoded(np.full((64, 64, 3), 9, np.uint8))[:60], "damaged or cut short"),
    (encoded(np.full((64, 64, 3), 9, np.uint8), "JPEG")[:200], "damaged or cut short"),
])
def test_bad_pictures_get_one_clear_error(data, message):
    with pytest.raises(PictureError, match=message) as err:
        fit_picture(data, 128)
    assert "\n" not in str(err.value)


def test_a_decompression_bomb_is_refused_before_decoding():
    buf = io.BytesIO()
    Image.new("1", (8000, 6000)).save(buf, format="PNG")  # 48 M pixels in a few KB
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(PictureError, match="8000x6000 pixels"):
        fit_picture(buf.getvalue(), 128)


def test_the_simulator_cannot_start_from_a_picture_and_goes_on():
    with Engine(SimBackend(), EngineConfig(max_sessions=1, fps=40, chunk_frames=2)) as engine:
        sid = engine.create_session("a green meadow", seed=0).session_id
        slot = engine.subscribe(sid, maxlen=1000)
        assert slot.get(timeout=120) is not None
        with pytest.raises(PictureError, match="model 'sim' cannot start from a picture"):
            worldio.start_from_picture(engine, sid, encoded(np.zeros((8, 8, 3), np.uint8)))
        assert slot.get(timeout=10) is not None


def test_builtin_stream_starts_from_the_picture():
    from worldstream.engine.backends.builtin import load_builtin_backend

    sim = WorldSimulator(seed=987_654, scene="desert")
    for _ in range(10):
        picture = sim.step(2)  # moving right
    config = EngineConfig(max_sessions=2, fps=15, steps=2, min_steps=2)
    with Engine(load_builtin_backend(), config) as engine:
        sid = engine.create_session("hot desert dunes", seed=5).session_id
        slot = engine.subscribe(sid, maxlen=1000)
        assert slot.get(timeout=120) is not None
        state = engine._sessions[sid].state
        with pytest.raises(PictureError, match="damaged or cut short"):
            worldio.start_from_picture(engine, sid, encoded(picture)[:100])
        assert engine._sessions[sid].state is state
        started = worldio.start_from_picture(engine, sid, encoded(picture)).result(timeout=60)
        frames, deadline = {}, time.monotonic() + 120
        while started["frame_index"] + 3 not in frames:
            assert time.monotonic() < deadline
            frame = slot.get(timeout=1.0)
            if frame is not None:
                frames[frame.index] = frame.rgb
        log = worldio.export_log(engine, sid).result(timeout=60)
    first = frames[started["frame_index"]]
    # the idle stream shows the picture it started from: 24.4 dB with the v2.1 weights (the
    # model's change to remembered ground, see assets/builtin/MODEL_CARD.md), while the same
    # frame of the session's own world before the start (desert, seed 5) is 11.5 dB away
    assert psnr(first, picture) > 22.0
    assert log["start"]["kind"] == "image"
    assert fit_picture(__import__("base64").b64decode(log["start"]["png"]), 128).tolist() == \
        picture.tolist()


class _PictureOracle:
    """Starts "from the picture" by stepping the episode's world to it (the simulator
    continuing from that frame); ``frozen``: holds the picture instead."""

    chunk_frames, width = 1, 128

    def __init__(self, ep, seed, frozen=False):
        self.ep, self.seed, self.frozen = ep, seed, frozen

    def new_state(self, prompt, seed, start_frames):
        from worldstream.engine.evaluation.picture_start import PICTURE_AT

        # the upload path (PNG, fit to 128 px) hands the model the frame itself
        assert np.array_equal(start_frames[0], self.ep.frames[PICTURE_AT])
        sim = WorldSimulator(self.seed, self.ep.scene)
        for action in self.ep.actions[:PICTURE_AT + 1]:
            sim.step(action)
        return {"sim": sim, "picture": start_frames[0]}

    def generate(self, jobs):
        from worldstream.engine.core.backend import ChunkResult

        (job,) = jobs
        if self.frozen:
            return [ChunkResult(np.stack([job.state["picture"]] * len(job.actions)))]
        return [ChunkResult(np.stack([job.state["sim"].step(a) for a in job.actions]))]

    def free(self, state):
        pass


def test_picture_start_metric_scores_the_simulator_perfectly_and_a_still_as_the_baseline():
    from worldstream.engine.evaluation.episodes import record
    from worldstream.engine.evaluation.picture_start import PICTURE_AT, picture_start_metrics

    ep = record(900_777, PICTURE_AT + 17)
    oracle = picture_start_metrics(_PictureOracle(ep, 900_777), [ep], [900_777], steps=1)
    assert oracle["picture_start_psnr_1_16"] == float("inf")
    still = picture_start_metrics(_PictureOracle(ep, 900_777, frozen=True), [ep], [900_777], 1)
    assert still["picture_start_psnr_1_16"] == still["picture_start_copy_psnr_1_16"] < 40

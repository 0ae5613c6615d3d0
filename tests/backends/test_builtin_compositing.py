"""The built-in backend's ``show`` stage (``compositing``): the pixel residual, its gate and
dead zone, the detail carried onto new ground (hand-worked, then tiny random models)."""

import numpy as np
import pytest

from tests.fixtures.builtin import F, exact_camera, tiny_generator
from worldstream.engine.backends.builtin import BuiltinConfig
from worldstream.engine.backends.builtin.compositing import (
    detail_gain,
    residual_weight,
    shading_detail,
    shrink_change,
)
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.spatial_memory import centre_box, model_inputs
from worldstream.engine.worlds.actions import IDLE
from worldstream.engine.worlds.simulator import WorldSimulator


def test_shrink_change_hand_worked():
    change = np.array([[10, -4, 2], [-5, 3, 0], [300, 0, -300]], np.int16)
    # largest channel 10 -> 10 - 6 = 4: scale 0.4; 5 -> 0; 300 -> 294: scale 0.98
    assert shrink_change(change, 6).tolist() == [[4, -2, 1], [0, 0, 0], [294, 0, -294]]
    assert shrink_change(change, 0).tolist() == change.tolist()


def test_residual_weight_hand_worked():
    """1 at or under t1, 0 at or over t2, linear between, on each pixel's largest channel
    averaged over the 5 x 5 square around it."""
    def uniform(value):
        change = np.zeros((1, 9, 9, 3), np.int16)
        change[..., 1] = value
        change[..., 0] = value // 4  # smaller channels do not count
        return change

    assert np.allclose(residual_weight(uniform(44), 24, 64), 0.5)
    assert np.allclose(residual_weight(uniform(-44), 24, 64), 0.5)
    assert np.allclose(residual_weight(uniform(10), 24, 64), 1.0)
    assert np.allclose(residual_weight(uniform(100), 24, 64), 0.0)
    lone = np.zeros((1, 9, 9, 3), np.int16)
    lone[0, 4, 4] = (250, 0, -250)  # one pixel: averaged to 10 at most, it does not switch
    assert np.allclose(residual_weight(lone, 24, 64), 1.0)
    block = np.zeros((1, 15, 15, 3), np.int16)
    block[0, 4:11, 4:11, 2] = 100  # 7 x 7 moved: its middle 3 x 3 average the full 100
    w = residual_weight(block, 24, 64)[0, ..., 0]
    assert w.shape == (15, 15) and np.allclose(w[6:9, 6:9], 0.0) and np.allclose(w[0, 0], 1.0)
    assert np.isclose(w[7, 4], 1 - (60 - 24) / 40)  # the block's edge: 3 of 5 columns, 60


def test_residual_gate_shows_the_decode_where_the_change_is_large():
    """A still camera, memory holding the start frame: a gate that opens at any change shows
    the model's own decode (as without the pixel residual); one over every change shows
    memory plus change (as without the gate)."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)

    def first_chunk(**cfg):
        gen = tiny_generator(**cfg)
        state = gen.new_state("a green meadow", seed=3, start_frames=start)
        (res,) = gen.generate([ChunkJob(state, [4] * F, steps=1, seed=0)])  # idle
        assert res.error is None
        return res.frames

    plain, decoded = first_chunk(), first_chunk(pixel_residual=False)
    opened = first_chunk(residual_gate=(0.0, 1e-3))
    assert np.abs(plain.astype(int) - decoded).mean() > 2  # the two ways differ here
    assert (opened == decoded).mean() > 0.99
    np.testing.assert_array_equal(first_chunk(residual_gate=(254.0, 255.0)), plain)
    for bad in ((10.0, 5.0), (-1.0, 5.0), (3.0, 3.0)):
        with pytest.raises(ValueError, match="residual_gate"):
            BuiltinConfig(residual_gate=bad)


def test_residual_deadzone_keeps_remembered_pixels_under_it():
    """A still camera: memory holds the start frame (but the centre box). Under a dead zone
    larger than any change, every remembered pixel is shown as remembered; without it the
    random model's changes show."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    keep = ~centre_box(128, 13)
    frames = {}
    for tau in (0.0, 254.0):
        gen = tiny_generator(residual_deadzone=tau)
        state = gen.new_state("a green meadow", seed=3, start_frames=start)
        (res,) = gen.generate([ChunkJob(state, [4] * F, steps=1, seed=0)])  # idle
        assert res.error is None
        frames[tau] = res.frames
    for frame in frames[254.0]:
        # real frames: the newest of the start chunk is what memory holds
        np.testing.assert_array_equal(frame[keep], start[-1][keep])
    assert np.abs(frames[0.0][:, keep].astype(int) - start[-1][keep]).mean() > 2
    with pytest.raises(ValueError, match="residual_deadzone"):
        BuiltinConfig(residual_deadzone=255)


def _onto_new_ground(**cfg):
    """A tiny generator with ``cfg`` started from random frames, moved right for two chunks
    (the second rewriting new ground the first generated beyond the start frames, which are
    final: real frames): ``(frames of the second chunk, generator, state, memory as the
    second chunk read it)``."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    gen = tiny_generator(**cfg)
    exact_camera(gen.model.camera)
    state = gen.new_state("a green meadow", seed=3, start_frames=start)
    gen.generate([ChunkJob(state, [5] * F, steps=1, seed=0)])  # right: new ground
    gen.finish()
    before = state.memory.fork()
    (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=1)])  # right
    gen.finish()
    assert res.error is None
    return res.frames, gen, state, before


def _carried_detail(gen, memory, x0: int, y0: int):
    """Recomputed from ``memory`` and the autoencoder, for the view at ``(x0, y0)``: its
    ``MemoryRead``, and on its refining pixels the decode of its base and the detail memory
    carries over it (picture less that decode), ``(P, 3)`` int16 each."""
    read = memory.read(x0, y0, 128)
    picture, _ = model_inputs(read, gen.downsample)
    base = gen.decode_latents(gen.encode_frames(picture[None]))[0].astype(np.int16)
    under = base[read.refining]
    return read, under, picture.astype(np.int16)[read.refining] - under


def test_detail_gain_hand_worked():
    detail = np.array([[3, 0, -4], [0, 0, 0]])  # RMS sqrt(25 / 6)
    assert detail_gain(detail, reference=1.5, cap=2.0) == 1.0  # RMS 2.04 <= 3: no limit
    assert detail_gain(detail, reference=0.5, cap=2.0) == pytest.approx(1 / np.sqrt(25 / 6))
    assert detail_gain(np.zeros((0, 3)), reference=0.1, cap=1.0) == 1.0
    assert detail_gain(np.zeros((4, 3)), reference=0.1, cap=1.0) == 1.0


def test_refining_detail_cap_limits_the_detail_carried_onto_new_ground():
    """Moving right on from generated ground with the cap: each frame shows, where it rewrites
    memory's not yet settled pixels, its decode plus the remembered detail (picture less
    the decode of its base) scaled to at most ``cap`` times the RMS the autoencoder loses on
    the start frames — each recomputed here from the memory and the autoencoder — and
    elsewhere what it shows without the cap; after a prompt switch nothing is limited."""
    # _onto_new_ground's start frames
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    cap = 0.005  # a cap that binds (the tiny random autoencoder loses more than it carries)
    runs = {limit: _onto_new_ground(refining_detail_cap=limit, refining_detail_shading=False)
            for limit in (None, cap)}
    (plain, _, _, _), (shown, gen, state, before) = runs[None], runs[cap]
    lost = start.astype(np.float32) - gen.decode_latents(gen.encode_frames(start))
    reference = float(np.sqrt(np.mean(np.square(lost))))
    assert state.detail_reference == pytest.approx(reference, rel=1e-5)
    rec = state.history[-1]
    model = gen.decode_latents(rec.latents).astype(np.int16)
    for i, (x0, y0) in enumerate(rec.origins):
        read, _, detail = _carried_detail(gen, before, x0, y0)
        rms = np.sqrt(np.mean(np.square(detail.astype(np.float64))))
        gain = cap * reference / rms
        assert read.refining.sum() > 100 and gain < 0.5
        expect = np.clip(model[i][read.refining] + np.rint(gain * detail), 0, 255)
        assert np.abs(shown[i][read.refining].astype(int) - expect).max() <= 1
        rest = read.current & ~read.refining
        np.testing.assert_allclose(shown[i][rest], plain[i][rest], atol=1)
    # a prompt switch: the reference becomes that of the frames a stream of the new prompt
    # (of a blend, its heavier part) would start from at the same world seed
    for blend, weight, scene in ((None, 0.0, "snow"), ("a desert", 0.3, "snow"),
                                 ("a desert", 0.7, "desert")):
        sim = WorldSimulator(3, scene)
        frames = np.stack([sim.step(IDLE) for _ in range(F)])
        lost = frames.astype(np.float32) - gen.decode_latents(gen.encode_frames(frames))
        gen.set_prompt(state, "a snowy forest", blend_text=blend, blend_weight=weight)
        assert state.detail_reference == pytest.approx(np.sqrt(np.mean(np.square(lost))),
                                                       rel=1e-5)


def test_shading_detail_hand_worked():
    colour = np.array([[99, 99, 99], [199, 99, 49], [0, 0, 0]])  # +1: (100,100,100), ...
    detail = np.array([[5.0, 5.0, 5.0], [10.0, -10.0, 0.0], [3.0, 0.0, 0.0]])
    out = shading_detail(detail, colour)
    np.testing.assert_allclose(out[0], [5, 5, 5])  # along the grey: all of it is shading
    # (200,100,50)·(10,-10,0) = 1000 over |c|² = 52,500: 0.019 of the colour
    np.testing.assert_allclose(out[1], np.array([200, 100, 50]) * 1000 / 52_500)
    np.testing.assert_allclose(out[2], [1, 1, 1])  # black shades along (1, 1, 1)
    # what is dropped is orthogonal to the colour: a hue of its own
    np.testing.assert_allclose(np.sum((detail - out)[:2] * (colour[:2] + 1), axis=-1), 0,
                               atol=1e-9)


def test_refining_detail_shading_keeps_only_the_carried_detail_along_the_decoded_colour():
    """Moving right on from generated ground: each frame shows, where it rewrites memory's
    not yet settled pixels, its decode plus the remembered detail (picture less the decode of
    its base) projected onto that decoded base colour — recomputed here from the memory and
    the autoencoder — and elsewhere what it shows without the setting."""
    runs = {on: _onto_new_ground(refining_detail_shading=on, refining_detail_cap=None)
            for on in (False, True)}
    (plain, _, _, _), (shown, gen, state, before) = runs[False], runs[True]
    rec = state.history[-1]
    model = gen.decode_latents(rec.latents).astype(np.int16)
    for i, (x0, y0) in enumerate(rec.origins):
        read, under, detail = _carried_detail(gen, before, x0, y0)
        assert read.refining.sum() > 100
        shade = shading_detail(detail.astype(np.float64), under)
        expect = np.clip(model[i][read.refining] + np.rint(shade), 0, 255)
        assert np.abs(shown[i][read.refining].astype(int) - expect).max() <= 1
        # and it changed something: the random start frames' detail has colours of its own
        # (the tiny model's decodes are dark, so it is small: 1.9 levels when written)
        full = np.clip(model[i][read.refining] + detail, 0, 255)
        assert np.abs(expect - full).mean() > 1
        rest = read.current & ~read.refining
        np.testing.assert_allclose(shown[i][rest], plain[i][rest], atol=1)

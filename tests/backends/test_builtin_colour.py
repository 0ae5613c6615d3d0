"""The built-in backend's colour anchor and colour prior (``colour``): hand-worked, then on
tiny random models."""

import numpy as np
import pytest

from tests.fixtures.builtin import F, exact_camera, tiny_generator
from worldstream.engine.backends.builtin import compositing
from worldstream.engine.backends.builtin.colour import anchor_colour
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.colour_prior import ColourPrior
from worldstream.engine.models.builtin.spatial_memory import centre_box
from worldstream.engine.worlds.actions import IDLE
from worldstream.engine.worlds.simulator import WorldSimulator


def test_anchor_colour_hand_worked():
    pixels = np.array([[100.0, 10.0, 50.0], [60.0, 30.0, 70.0]])
    mean = np.array([80.0, 20.0, 60.0])
    reference = np.array([50.0, 40.0, 58.0])
    out = anchor_colour(pixels, mean, reference, tolerance=10.0)
    # red above the band (60): scaled by 60 / 80; green below it (30): lifted by 10; blue
    # within it: unchanged
    np.testing.assert_allclose(out, [[75.0, 20.0, 50.0], [45.0, 40.0, 70.0]])
    np.testing.assert_allclose(anchor_colour(pixels, mean, mean, 0.0), pixels)


@pytest.mark.parametrize("level", [0, 255])
def test_colour_anchor_corrects_generated_ground_by_the_running_mean_beyond_the_tolerance(
        monkeypatch, level):
    """Moving right from black (white) start frames: with the anchor each frame of the chunk
    shows, on the ground the model generates (not current in memory, or being refined; the
    sprite excluded), the frame without the anchor brought into the tolerance band around the
    start frames' colour by its running mean — scaled down from above black, lifted below
    white — the running mean recomputed here from the frames without it; everything else
    alike."""
    import worldstream.engine.backends.builtin.colour as colour

    monkeypatch.setattr(colour, "ANCHOR_DECAY", 0.5)  # a correction large enough to see
    start = np.full((F, 128, 128, 3), level, np.uint8)
    tolerance = 3.0
    runs = {}
    for anchor in (None, tolerance):
        gen = tiny_generator(colour_anchor=anchor)
        exact_camera(gen.model.camera)
        state = gen.new_state("a green meadow", seed=3, start_frames=start)
        gen._prefill(state)  # the start frames into context and memory now
        before = state.memory.fork()
        (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=0)])  # right
        gen.finish()
        assert res.error is None
        runs[anchor] = (res.frames, state, before, gen)
    (plain, _, _, _), (shown, state, before, gen) = runs[None], runs[tolerance]
    np.testing.assert_array_equal(state.colour_reference, [level] * 3)
    mean = np.full(3, float(level))
    sprite = centre_box(128, gen.model.config.view_box)
    for i, (x0, y0) in enumerate(state.history[-1].origins):
        read = before.read(x0, y0, 128)
        ground = (~read.current | read.refining) & ~sprite
        assert ground.sum() > 100
        pixels = plain[i][ground].astype(np.float64)
        mean = 0.5 * mean + 0.5 * pixels.mean(axis=0)
        expect = pixels.copy()
        for c in range(3):  # above the band: a gain to its top; below it: a shift to its foot
            if mean[c] > level + tolerance:
                expect[:, c] *= (level + tolerance) / mean[c]
            elif mean[c] < level - tolerance:
                expect[:, c] += level - tolerance - mean[c]
        expect = np.clip(np.rint(expect), 0, 255)
        assert np.abs(expect - pixels).max() > 2
        assert np.abs(shown[i][ground].astype(int) - expect).max() <= 1
        np.testing.assert_allclose(shown[i][~ground], plain[i][~ground], atol=1)
    np.testing.assert_allclose(state.history[-1].colour_mean, mean, atol=0.05)


def test_a_prompt_switch_restarts_the_colour_anchor_at_its_first_generated_frame(monkeypatch):
    """A running mean that never moves (decay 1) and a tolerance that never corrects: the
    mean after the start frames is their colour; after a prompt switch the reference is the
    snow scene's start frames' mean colour at the same world seed (computed here from the
    simulator) and the running mean that of the first frame's generated ground after the
    switch; after a rewind past the switch, that of the first frame generated after the
    rewind (the chunks kept were kept against the old reference). The generated ground of
    each frame is read from what the anchor was given."""
    import worldstream.engine.backends.builtin.colour as colour

    monkeypatch.setattr(colour, "ANCHOR_DECAY", 1.0)
    start = np.zeros((F, 128, 128, 3), np.uint8)
    sim = WorldSimulator(3, "snow")
    snow = np.stack([sim.step(IDLE) for _ in range(F)]).reshape(-1, 3).mean(axis=0)
    gen = tiny_generator(colour_anchor=1000.0)
    exact_camera(gen.model.camera)
    seen = []
    spy = compositing.anchor_colours

    def anchor_colours(backend, states, records, rgb, views):
        generated = (~views.current | views.refining) & ~gen.exclude
        seen.append(rgb[0][generated[0]].astype(np.float64).mean(axis=0))  # first frame
        spy(backend, states, records, rgb, views)

    monkeypatch.setattr(compositing, "anchor_colours", anchor_colours)
    state = gen.new_state("a green meadow", seed=3, start_frames=start)

    def chunk(seed):
        (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=seed)])  # right
        assert res.error is None
        return seen[-1]

    chunk(0)
    chunk(1)
    np.testing.assert_array_equal(state.history[-1].colour_mean, [0.0, 0.0, 0.0])
    gen.set_prompt(state, "a snowy forest")
    np.testing.assert_allclose(state.colour_reference, snow)
    first = chunk(2)
    chunk(3)
    np.testing.assert_allclose(state.history[-1].colour_mean, first)
    np.testing.assert_array_equal(state.history[-1].colour_reference, state.colour_reference)
    gen.rewind(state, 3)  # back to the first chunk after the start, kept against black
    first = chunk(4)
    gen.finish()
    np.testing.assert_allclose(state.history[-1].colour_mean, first)
    assert np.abs(first - snow).max() > 1 and np.abs(first).max() > 1


def test_a_colour_prior_shrinks_the_reference_toward_the_scene_colour():
    """With a colour prior the reference is the real frames' mean colour shrunk toward the
    prompt's scene's colour by the prior's view weight (and the running mean starts there);
    after a prompt switch the same of the new scene's start view at the world seed (computed
    here from the simulator); of a blend, its heavier part's, also for real frames observed
    under the blend; a scene the prior does not know keeps its view's colour."""
    prior = ColourPrior({"meadow": (80.0, 140.0, 90.0), "snow": (170.0, 180.0, 190.0)}, 0.25)
    gen = tiny_generator(colour_anchor=8.0, colour_prior=prior)
    state = gen.new_state("a green meadow", seed=3,
                          start_frames=np.full((F, 128, 128, 3), 100, np.uint8))
    gen._prefill(state)
    np.testing.assert_allclose(state.colour_reference, [85.0, 130.0, 92.5])
    np.testing.assert_allclose(state.history[-1].colour_mean, [85.0, 130.0, 92.5])

    def start_view(scene):
        sim = WorldSimulator(3, scene)
        return np.stack([sim.step(IDLE) for _ in range(F)]).reshape(-1, 3).mean(axis=0)

    snow = np.array([170.0, 180.0, 190.0])
    for blend, weight, expect in (
            (None, 0.0, snow + 0.25 * (start_view("snow") - snow)),
            ("a sandy desert", 0.3, snow + 0.25 * (start_view("snow") - snow)),
            ("a sandy desert", 0.7, start_view("desert"))):
        gen.set_prompt(state, "a snowy forest", blend_text=blend, blend_weight=weight)
        np.testing.assert_allclose(state.colour_reference, expect)
    # real frames observed after a blend whose heavier part is the snow: the snow's colour
    gen.set_prompt(state, "a sandy desert", blend_text="a snowy forest", blend_weight=0.7)
    gen.observe(state, np.full((F, 128, 128, 3), 100, np.uint8), [IDLE] * F)
    np.testing.assert_allclose(state.colour_reference, snow + 0.25 * (100.0 - snow))

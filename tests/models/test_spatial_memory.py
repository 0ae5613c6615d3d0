"""The spatial memory: read after write, revisits, best-view writes, epochs (restyle), forks,
undo, bounded size, and retrieval of KV pages by camera overlap."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldstream.engine.models.builtin.spatial_memory import (
    SpatialMemory,
    centre_box,
    model_inputs,
    select_by_overlap,
)
from worldstream.engine.worlds.simulator import WorldSimulator


def frame(seed: int, size: int = 128) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


@settings(max_examples=25, deadline=None)
@given(st.integers(-300, 300), st.integers(-300, 300), st.integers(0, 10**6))
def test_read_after_write_returns_what_was_written(x0, y0, seed):
    mem = SpatialMemory(tile=64)
    img = frame(seed)
    mem.write(x0, y0, img)
    got = mem.read(x0, y0, 128)
    assert np.array_equal(got.rgb, img) and got.current.all() and not got.stale.any()
    # a window shifted by (dx, dy) sees the same pixels where it overlaps, nothing elsewhere
    shifted = mem.read(x0 + 37, y0 - 5, 128)
    assert np.array_equal(shifted.rgb[5:, :91], img[:-5, 37:])
    assert shifted.current[5:, :91].all() and not shifted.current[:5].any()
    assert not shifted.current[:, 91:].any()


def test_excluded_pixels_stay_unknown():
    mem = SpatialMemory()
    box = centre_box(128, 15)
    mem.write(0, 0, frame(1), exclude=box)
    got = mem.read(0, 0, 128)
    assert not got.current[box].any() and got.current[~box].all()
    assert box.sum() == 15 * 15


def test_a_revisit_reads_the_same_content():
    """Simulator frames written along a path out and back (animated water, clouds and
    creatures included): at the start position memory still holds the first frame wherever
    that frame saw the ground settled (>= settle_px from its border), and what it held when
    the camera left, everywhere it had settled by then."""
    sim = WorldSimulator(seed=5, scene="meadow")
    mem = SpatialMemory(settle_px=16)
    first = sim.render()
    start = sim.crop_origin()
    mem.write(*start, first)
    for action in [5] * 10 + [4] * 25:  # right, then coast to rest
        mem.write(*sim.crop_origin(), sim.step(action))
    left = mem.read(*start, 128).rgb
    for action in [3] * 10 + [4] * 25:  # left, then coast to rest
        mem.write(*sim.crop_origin(), sim.step(action))
    assert sim.crop_origin() == start  # the simulator's camera came back
    back = mem.read(*start, 128).rgb
    assert np.array_equal(back[16:-16, 16:-16], first[16:-16, 16:-16])
    settled = np.zeros((128, 128), bool)
    settled[16:-16, 16:] = True  # the outward trip saw the right border's ground centrally
    assert np.array_equal(back[settled], left[settled])


def test_refining_marks_exactly_what_a_frame_at_the_window_would_rewrite():
    mem = SpatialMemory(settle_px=16)
    mem.write(0, 0, frame(1))
    assert not mem.read(0, 0, 128).refining.any()  # the same view again rewrites nothing
    read = mem.read(3, 0, 128)  # the camera 3 px to the right
    # hand-worked: column j of this window is world column j + 3, stored with the view
    # min(j + 4, 128 - (j + 3), 16) (rows: all >= 16 away except the 16 rows at each edge);
    # it is refined where the new view min(j + 1, 128 - j, 16) is larger
    col = np.arange(128)
    old = np.minimum(np.minimum(col + 4, 125 - col), 16)
    new = np.minimum(np.minimum(col + 1, 128 - col), 16)
    expect = (new > old) & (col < 125)  # columns 125-127 are unknown: not current
    assert np.array_equal(read.refining[64], expect)
    # the 15 columns the first frame saw within 16 px of its right border (j = 110..124),
    # each now seen 3 px farther in
    assert np.flatnonzero(expect).tolist() == list(range(110, 125))
    # what write() then overwrites is exactly that (plus the unknown columns)
    before = mem.read(3, 0, 128).rgb.copy()
    b = frame(2)
    mem.write(3, 0, b)
    after = mem.read(3, 0, 128)
    changed = (after.rgb != before).any(-1)
    assert np.array_equal(changed[16:-16] & read.current[16:-16], read.refining[16:-16])


def test_best_view_settles_each_pixel():
    mem = SpatialMemory(settle_px=16)
    a, b, c = frame(1), frame(2), frame(3)
    mem.write(0, 0, a)
    # b sees the column x = 127 (a's border, distance 1) at distance 61 from its own border:
    # better view, rewritten; a's interior (distance >= 16 in a) stays a's
    mem.write(66, 0, b)
    got = mem.read(0, 0, 128).rgb
    assert np.array_equal(got[64, 127], b[64, 127 - 66])
    assert np.array_equal(got[64, 70], a[64, 70])
    # a settled pixel is never rewritten in the same epoch
    mem.write(0, 0, c)
    assert np.array_equal(mem.read(0, 0, 128).rgb[64, 70], a[64, 70])


def test_a_settled_write_is_final_for_the_epoch():
    """A real frame (``settled``) is exact up to its border: no generated frame of the same
    epoch rewrites it, however much farther from its own border it sees a pixel; a later real
    frame (the newer truth) and a new epoch do."""
    mem = SpatialMemory(settle_px=16)
    a, b, c = frame(1), frame(2), frame(3)
    mem.write(0, 0, a, settled=True)
    assert not mem.read(3, 0, 128).refining.any()  # cf. the hand-worked case above
    mem.write(66, 0, b)  # sees a's border column x = 127 at 61 px from its own border
    got = mem.read(0, 0, 128).rgb
    np.testing.assert_array_equal(got, a)
    # b's ground beyond a's window is written as usual
    np.testing.assert_array_equal(mem.read(128, 0, 64).rgb, b[:64, 62:126])
    mem.write(3, 0, c, settled=True)  # everywhere, the border too
    np.testing.assert_array_equal(mem.read(3, 0, 128).rgb, c)
    mem.write(0, 0, b)  # sees c's border column x = 3 at 4 px from its own: no rewrite
    np.testing.assert_array_equal(mem.read(3, 0, 128).rgb, c)
    c = frame(4)
    mem.new_epoch()
    mem.write(0, 0, c)
    np.testing.assert_array_equal(mem.read(0, 0, 128).rgb, c)


def test_new_epoch_marks_stale_and_restyles_on_sight():
    mem = SpatialMemory()
    a, b = frame(1), frame(2)
    mem.write(0, 0, a)
    mem.new_epoch()
    got = mem.read(0, 0, 128)
    assert got.stale.all() and not got.current.any() and np.array_equal(got.rgb, a)
    mem.write(0, 0, b)
    got = mem.read(0, 0, 128)
    assert got.current.all() and np.array_equal(got.rgb, b)


def test_fork_is_copy_on_write_and_undo_restores():
    mem = SpatialMemory()
    a, b = frame(1), frame(2)
    mem.write(0, 0, a)
    twin = mem.fork()
    twin.new_epoch()
    undo = twin.write(0, 0, b)
    assert np.array_equal(mem.read(0, 0, 128).rgb, a)  # the parent is untouched
    assert np.array_equal(twin.read(0, 0, 128).rgb, b)
    twin.undo(undo)
    assert np.array_equal(twin.read(0, 0, 128).rgb, a)
    # undoing a write into unknown ground makes it unknown again
    undo = mem.write(500, 500, b)
    mem.undo(undo)
    assert not mem.read(500, 500, 128).current.any()


def test_memory_is_bounded_by_least_recently_used_tiles():
    mem = SpatialMemory(tile=64, max_tiles=12)
    for i in range(20):
        mem.write(200 * i, 0, frame(i))
        assert mem.num_tiles <= 12
    # the newest frame is still there, the oldest forgotten
    assert mem.read(200 * 19, 0, 128).current.all()
    assert not mem.read(0, 0, 128).current.any()


def test_model_inputs_fill_unknown_with_grey_and_pool_the_masks():
    mem = SpatialMemory()
    mem.write(0, 0, np.full((128, 128, 3), 200, np.uint8))
    mem.new_epoch()
    mem.write(64, 0, np.full((128, 128, 3), 100, np.uint8))
    # window x in [-32, 96): unknown | stale (200) | current (100), 32 px each... and 32 more
    rgb, planes = model_inputs(mem.read(-32, 0, 128), 4)
    assert (rgb[:, :32] == 128).all() and (rgb[:, 32:96] == 200).all()
    assert (rgb[:, 96:] == 100).all()
    assert planes.shape == (2, 32, 32)
    assert (planes[0, :, 24:] == 1).all() and (planes[0, :, :24] == 0).all()
    assert (planes[1, :, 8:24] == 1).all() and (planes[1, :, :8] == 0).all()
    assert (planes[1, :, 24:] == 0).all()


def test_non_square_writes_are_refused_and_change_nothing():
    mem = SpatialMemory()
    with pytest.raises(ValueError):
        mem.write(0, 0, np.zeros((128, 64, 3), np.uint8))
    assert mem.num_tiles == 0


def test_pages_are_retrieved_by_camera_overlap():
    pages = [10, 11, 12, 13, 14]
    origins = [(0, 0), (100, 0), (300, 300), (20, 10), (-120, 0)]
    # the view at (10, 0) overlaps pages 10 (118x128 px), 13 (118x118), 11 (38x128); page 14
    # lies 130 px away and page 12 far off
    assert select_by_overlap(pages, origins, np.array([10, 0]), 128, 2) == [10, 13]
    assert select_by_overlap(pages, origins, np.array([10, 0]), 128, 10) == [10, 11, 13]
    assert select_by_overlap(pages, origins, np.array([1000, 0]), 128, 3) == []

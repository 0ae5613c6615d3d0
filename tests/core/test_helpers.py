"""Helpers supervised (issue 74, kind 1): a helper process that dies or hangs is replaced, only
its job fails (with HelperError, naming the cause), and the next job works; crafter's episode
starts survive their process being killed, and its worlds are made off the engine thread."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from worldstream.engine.core.helpers import HelperError, HelperPool, run_in_child


def test_a_killed_helper_process_is_replaced_and_the_next_job_works():
    pool = HelperPool(1, timeout_s=120)
    try:
        first = pool.submit(os.getpid).result(120)
        stuck = pool.submit(time.sleep, 60)
        os.kill(first, signal.SIGKILL)
        with pytest.raises((BrokenProcessPool, HelperError)):
            stuck.result(120)  # the job it held fails, alone
        again = pool.submit(os.getpid)
        assert again is not None and again.result(120) != first
        assert pool.replaced == 1
    finally:
        pool.close()


def test_a_hung_helper_is_killed_past_its_timeout():
    now = [0.0]
    pool = HelperPool(1, timeout_s=5, clock=lambda: now[0])
    try:
        first = pool.submit(os.getpid).result(120)
        hung = pool.submit(time.sleep, 600)
        time.sleep(0.5)  # let it start
        now[0] = 10.0  # past its timeout: the next submit replaces the pool
        after = pool.submit(os.getpid)
        with pytest.raises((BrokenProcessPool, HelperError)):
            hung.result(120)
        assert after is not None and after.result(120) != first
    finally:
        pool.close()


def test_a_full_helper_says_so_at_once():
    pool = HelperPool(1, max_pending=1, timeout_s=120)
    try:
        busy = pool.submit(time.sleep, 2)
        assert busy is not None and pool.submit(os.getpid) is None
        busy.result(120)
    finally:
        pool.close()


def test_a_child_that_dies_or_hangs_is_named_as_such():
    with pytest.raises(HelperError, match="died"):
        run_in_child(os._exit, 3, timeout_s=120, what="the replay")
    t0 = time.monotonic()
    with pytest.raises(HelperError, match="did not finish within 1 s"):
        run_in_child(time.sleep, 600, timeout_s=1, what="the replay")
    assert time.monotonic() - t0 < 60  # killed, not waited for


@pytest.fixture(scope="module")
def crafter():
    pytest.importorskip("crafter")
    from worldstream.engine.backends.game.sim import GameEnvBackend

    backend = GameEnvBackend(env="CrafterReward-v1", max_states=4)
    yield backend
    backend.close()


def test_crafter_starts_survive_their_process_being_killed(crafter):
    """Once the starts process died, no session could be created ("process pool is not
    usable anymore") and playing sessions ended at their next game over."""
    make = crafter.prepare_state("play", 5)
    state = make()
    try:
        assert state.next_start is not None and crafter._starts is not None
        for pid in crafter._starts.processes():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        # a new session is made (its world by a fresh process), and the game over of the
        # playing one falls back to a reset
        other = crafter.prepare_state("play", 6)()
        try:
            assert other.game.frame is not None
            state.game.done = True  # as at a game over
            frame, event = crafter.step(state, 0)
            assert event is not None and event["episode"] == 1 and frame.shape[-1] == 3
        finally:
            crafter.free(other)
    finally:
        crafter.free(state)


def test_a_crafter_fork_into_a_fresh_env_generates_no_world(crafter):
    """A fork restored its copy into a fresh env after a reset that generated a world for
    nothing (~1.2 s on the engine thread per branch)."""
    from worldstream.engine.worlds.game.env import GameEnv

    state = crafter.prepare_state("play", 7)()
    try:
        snap = state.game.snapshot()
        fresh = GameEnv(crafter.env_id, size=crafter.size)
        called = []
        original = fresh.env.unwrapped.env.reset
        fresh.env.unwrapped.env.reset = lambda *a, **k: called.append(1) or original(*a, **k)
        try:
            frame = fresh.restore(snap)
            fresh.step(1)
        finally:
            fresh.close()
        assert called == [] and frame.shape == (crafter.size, crafter.size, 3)
    finally:
        crafter.free(state)

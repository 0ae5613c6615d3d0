"""The engine thread end to end, with a small echo backend (its frames encode what each chunk
was conditioned on) and with the SimBackend checked against a hand-stepped WorldSimulator."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.engine import EchoBackend, cfg, collect, drain_events, wait_for
from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.api import (
    ActionCommand,
    AdoptCommand,
    CapacityError,
    ForkCommand,
    PromptCommand,
    RewindCommand,
    SessionClosedError,
    SettingsCommand,
)
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.worlds.actions import IDLE, keys_to_action
from worldstream.engine.worlds.simulator import WorldSimulator


class CountingSim(SimBackend):
    """The simulator backend counting its live states (the engine must free every one)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.num_states = 0

    def new_state(self, prompt, seed):
        state = super().new_state(prompt, seed)
        self.num_states += 1
        return state

    def fork(self, state):
        twin = super().fork(state)
        self.num_states += 1
        return twin

    def free(self, state):
        self.num_states -= not state.freed
        super().free(state)


def wait_event(queue, kind, timeout=5.0):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            event = queue.get(timeout=0.05)
        except Exception:
            continue
        seen.append(event)
        if event.kind == kind:
            return event, seen
    raise AssertionError(f"no {kind!r} event; saw {[e.kind for e in seen]}")


# ---------------------------------------------------------------------------- metadata
def test_sim_frames_equal_hand_stepped_world_and_metadata_follows_actions():
    backend = SimBackend(scene_for=lambda p: "meadow")
    with Engine(backend, cfg()) as engine:
        info = engine.create_session("meadow", seed=11)
        assert (info.width, info.height, info.fps) == (128, 128, 60)
        slot = engine.subscribe(info.session_id, maxlen=1000)
        keys = {1: {"up"}, 2: {"right"}, 3: {"down", "left"}}
        frames = collect(slot, 6)
        for seq in (1, 2, 3):
            engine.submit(info.session_id, ActionCommand(seq, 1000.0 * seq, frozenset(keys[seq])))
            frames += collect(slot, 8)
        metrics = engine.metrics()["sessions"][info.session_id]
    action_of = {-1: IDLE, **{seq: keys_to_action(k) for seq, k in keys.items()}}
    ref = WorldSimulator(11, "meadow")
    assert [f.index for f in frames] == list(range(len(frames)))
    assert [f.action_seq for f in frames] == sorted(f.action_seq for f in frames)
    assert frames[-1].action_seq == 3
    for frame in frames:
        np.testing.assert_array_equal(frame.rgb, ref.step(action_of[frame.action_seq]))
        assert frame.action_t_ms == (None if frame.action_seq < 0 else 1000.0 * frame.action_seq)
        assert frame.chunk_index == frame.index // 2 and frame.prompt_version == 0
        assert {"queue", "simulate"} <= set(frame.stages_ms)
    assert metrics["action_to_frame_ms"]["count"] == 3
    assert 0 < metrics["action_to_frame_ms"]["p50"] <= metrics["action_to_frame_ms"]["p95"]


def test_prompt_version_and_settings_match_the_conditioning():
    backend = EchoBackend()
    with Engine(backend, cfg()) as engine:
        sid = engine.create_session("a meadow", seed=1).session_id
        slot, events = engine.subscribe(sid, maxlen=1000), engine.events(sid)
        frames = collect(slot, 4)
        engine.submit(sid, PromptCommand(1, 0.0, "a desert"))
        engine.submit(sid, SettingsCommand(2, steps=9))  # invalid: reported, session goes on
        engine.submit(sid, SettingsCommand(3, steps=2, chunk_frames=3))
        engine.submit(sid, SettingsCommand(4, memory_frames=32))  # echo has no such setting
        engine.submit(sid, PromptCommand(5, 0.0, ""))
        engine.submit(sid, SettingsCommand(6, chunk_frames=4))  # echo makes chunks of 2 or 3
        frames += collect(slot, 12)
        errors = [e.payload for e in drain_events(events) if e.kind == "error"]
        assert engine.num_sessions() == 1
    assert [(e["seq"], e["field"], e["code"]) for e in errors] == [
        (2, "steps", "invalid"), (4, "memory_frames", "unsupported"), (5, "text", "invalid"),
        (6, "chunk_frames", "unsupported")]
    for frame in frames:  # the metadata says what the backend was really conditioned on
        assert frame.prompt_version == frame.rgb[0, 0, 2]
    assert frames[-1].prompt_version == 1
    chunk_sizes = [sum(1 for f in frames if f.chunk_index == c) for c in
                   sorted({f.chunk_index for f in frames})]
    assert chunk_sizes[0] == 2 and chunk_sizes[-2] == 3  # the last chunk may be cut by collect
    assert frames[-1].rgb[0, 0, 1] == 2


# ---------------------------------------------------------------------------- scheduling
def test_due_sessions_are_batched_and_shapes_never_mix():
    backend = EchoBackend(delay_s=0.01)
    with Engine(backend, cfg(fps=30)) as engine:
        a = engine.create_session("a", seed=1).session_id
        slot_a = engine.subscribe(a, maxlen=1000)
        collect(slot_a, 5)  # b starts with its playout clock out of step with a's
        b = engine.create_session("b", seed=2).session_id
        collect(slot_a, 20)
        same_shape = list(backend.calls)
        engine.submit(b, SettingsCommand(1, steps=2))
        collect(slot_a, 16)
    calls = backend.calls
    # after a few chunks the two clocks are in step: every call generates both sessions
    assert [len(call) for call in same_shape[-5:]] == [2] * 5
    for call in calls:
        assert len({(steps, frames) for _, steps, frames in call}) == 1
    assert any({steps for _, steps, _ in call} == {2} for call in calls)


def test_buffer_never_exceeds_its_bound():
    backend = EchoBackend()
    with Engine(backend, cfg(fps=40, buffer_max_frames=6)) as engine:
        sid = engine.create_session("a", seed=1).session_id
        slot = engine.subscribe(sid, maxlen=1000)
        t0 = time.monotonic()
        frames = collect(slot, 40, timeout=3.0)
        elapsed = time.monotonic() - t0
        metrics = engine.metrics()["sessions"][sid]
    assert len(frames) == 40
    assert elapsed > (40 - 6) / 40 * 0.9  # paced by the playout clock, not as fast as possible
    # (late frames are possible on a loaded machine: the bound is what is tested)
    assert metrics["frames"] >= 40
    t_first = frames[0].t_ready_ns
    for frame in frames:  # frames generated ahead of the clock, counted independently
        presented = (frame.t_ready_ns - t_first) * 40 / 1e9
        assert frame.index + 1 - presented <= 6 + 1e-6
    assert 30 <= metrics["fps"] <= 50 and metrics["buffer_frames"] <= 6


def test_slow_backend_degrades_steps_first_then_fps():
    # 4 steps: 40 + 4·30 = 160 ms per chunk of 2 frames; 30 fps needs <= 67 ms
    backend = EchoBackend(delay_s=0.04, step_s=0.03)
    config = cfg(fps=30, degrade_after_misses=2, recover_after_chunks=10_000)
    with Engine(backend, config) as engine:
        sid = engine.create_session("a", seed=1).session_id
        events = engine.events(sid)
        assert wait_for(lambda: engine.metrics()["sessions"][sid]["target_fps"] < 30, timeout=8)
        degraded = [e.payload for e in drain_events(events) if e.kind == "degraded"]
        metrics = engine.metrics()["sessions"][sid]
    assert [(d["steps"], d["fps"]) for d in degraded[:4]] == [(3, 30), (2, 30), (1, 30), (1, 22)]
    assert all(d["degraded"] and d["reason"] == "chunks late" for d in degraded)
    assert metrics["degraded"] and metrics["steps"] == 1 and metrics["late_frames"] > 0
    steps_used = [call[0][1] for call in backend.calls]
    assert steps_used == sorted(steps_used, reverse=True) and steps_used[-1] == 1


# ---------------------------------------------------------------------------- failures
def test_failing_chunk_ends_only_its_session():
    backend = EchoBackend()
    with Engine(backend, cfg()) as engine:
        good = engine.create_session("fine", seed=1).session_id
        bad = engine.create_session("boom", seed=2).session_id
        slot_good, slot_bad = engine.subscribe(good, maxlen=1000), engine.subscribe(bad)
        events = engine.events(bad)
        error, _ = wait_event(events, "error")
        assert "NaN in chunk" in error.payload["message"]
        wait_event(events, "closed")
        assert wait_for(lambda: slot_bad.closed)
        with pytest.raises(SessionClosedError):
            engine.submit(bad, ActionCommand(1, 0.0))
        collect(slot_good, 1000, timeout=0.05)  # frames made before the failure
        assert len(collect(slot_good, 10)) == 10  # the other session goes on
        assert engine.num_sessions() == 1
        assert bad not in engine.metrics()["sessions"]
        # an exception inside a command also ends only that session
        engine.submit(good, PromptCommand(1, 0.0, "crash"))
        wait_event(engine.events(good), "closed")
        assert engine.num_sessions() == 0
        assert wait_for(lambda: not backend.live)


def test_capacity_refusal_and_release():
    backend = EchoBackend(max_states=3)
    with Engine(backend, cfg(max_sessions=2, retry_after_s=7.0)) as engine:
        assert engine.capacity == 2
        a = engine.create_session("a").session_id
        engine.create_session("b")
        with pytest.raises(CapacityError) as info:
            engine.create_session("c")
        assert info.value.retry_after_s == 7.0
        engine.close_session(a)
        c = engine.create_session("c").session_id  # the session slot is free at once
        # two live states + a fork of 2 would exceed the backend's 3: refused, session goes on
        engine.submit(c, ForkCommand(1, k=2))
        error, _ = wait_event(engine.events(c), "error")
        assert (error.payload["field"], error.payload["code"]) == ("k", "capacity")
        with pytest.raises(ValueError):
            engine.create_session("")
        with pytest.raises(ValueError):
            engine.create_session("a", fps=1000)
    assert not backend.live  # stop() freed every state


def test_state_budget_follows_forks_and_adopts():
    backend = EchoBackend(max_states=4)
    with Engine(backend, cfg(max_sessions=3, max_fork=3, preview_chunks=1)) as engine:
        a = engine.create_session("a").session_id
        events_a = engine.events(a)
        engine.submit(a, ForkCommand(1, k=3))  # 1 + 3 = 4 states: the whole budget
        wait_event(events_a, "preview")
        with pytest.raises(CapacityError, match="4 states"):
            engine.create_session("b")
        engine.submit(a, AdoptCommand(2, branch=2))  # back to 1 state
        wait_event(events_a, "info")
        b = engine.create_session("b").session_id
        engine.submit(b, ForkCommand(1, k=2))  # 2 + 2 = 4 fits exactly
        _, seen = wait_event(engine.events(b), "preview")
        assert all(e.kind != "error" for e in seen)
        assert len(backend.live) == 4
    assert not backend.live


def test_concurrent_submit_keeps_the_newest_action():
    backend = EchoBackend()
    with Engine(backend, cfg()) as engine:
        sid = engine.create_session("a").session_id
        slot = engine.subscribe(sid, maxlen=1000)
        key_sets = [frozenset(), frozenset({"up"}), frozenset({"left"}), frozenset({"down"})]

        def client(offset):
            for seq in range(offset, 400, 4):
                engine.submit(sid, ActionCommand(seq, float(seq), key_sets[seq % 4]))
                engine.metrics()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        frames = collect(slot, 1000, timeout=0.5)
        assert wait_for(lambda: (frames.extend(collect(slot, 100, 0.05)) or
                                 frames[-1].action_seq == 399))
    for frame in frames:  # every frame was generated with the keys of its action_seq
        if frame.action_seq >= 0:
            assert frame.rgb[0, 0, 0] == keys_to_action(key_sets[frame.action_seq % 4])
    seqs = [f.action_seq for f in frames]
    assert seqs == sorted(seqs)


# ---------------------------------------------------------------------------- branches
def _world_times(frames, ref_index):
    return [ref_index[f.rgb.tobytes()] for f in frames]


def test_fork_adopt_rewind_through_the_engine():
    backend = CountingSim(scene_for=lambda p: "meadow")
    ref = WorldSimulator(4, "meadow")
    ref_frames = [ref.step(IDLE) for _ in range(400)]  # world time t -> frame at index t - 1
    ref_index = {rgb.tobytes(): t for t, rgb in enumerate(ref_frames, start=1)}
    assert len(ref_index) == len(ref_frames)  # every world time looks different
    config = cfg(fps=30, preview_chunks=2)
    with Engine(backend, config) as engine:
        sid = engine.create_session("meadow", seed=4).session_id
        slot, events = engine.subscribe(sid, maxlen=1000), engine.events(sid)
        before = collect(slot, 6)
        engine.submit(sid, ForkCommand(1, k=2))
        previews = [wait_event(events, "preview")[0].payload for _ in range(2)]
        during = collect(slot, 1000, timeout=0.05)
        engine.submit(sid, AdoptCommand(2, branch=1))
        wait_event(events, "info")
        after_adopt = collect(slot, 8)
        engine.submit(sid, RewindCommand(3, chunks=2))
        assert wait_event(events, "info")[0].payload["rewound"] == 2
        after_rewind = collect(slot, 8)
        engine.submit(sid, RewindCommand(4, chunks=99))
        error, _ = wait_event(events, "error")
        assert error.payload["field"] == "chunks" and engine.num_sessions() == 1
    # previews: both branches continue the world from the fork point, 2 chunks of 2 frames
    assert [p["branch"] for p in previews] == [0, 1] and {p["fork_id"] for p in previews} == {0}
    fork_t = [ref_index[rgb.tobytes()] for rgb in previews[1]["frames"]]
    assert fork_t == list(range(fork_t[0], fork_t[0] + 4))
    stream = before + during + after_adopt + after_rewind
    times = _world_times(stream, ref_index)
    jumps = [(a, b) for a, b in zip(times, times[1:], strict=False) if b != a + 1]
    # exactly two discontinuities: adopt continues after the adopted preview, rewind goes
    # back two chunks (4 frames) from the newest frame generated before it
    assert len(jumps) == 2
    assert jumps[0][1] == fork_t[-1] + 1
    assert jumps[1][1] == jumps[1][0] - 4 + 1
    assert [f.index for f in stream] == list(range(len(stream)))
    assert not backend.num_states


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["open", "close", "fork", "adopt", "rewind", "act"]),
                          st.integers(0, 3), st.integers(1, 3)), max_size=25))
def test_random_session_and_branch_sequences_leak_no_state(ops):
    """The engine's state budget keeps the backend from ever refusing, and every state comes
    back, whatever the order of opens, forks, adopts, rewinds and closes."""
    backend = EchoBackend(max_states=5)
    engine = Engine(backend, cfg(max_sessions=3, max_fork=3, preview_chunks=1)).start()
    sids, queues, seq = [], [], 0

    def open_session(seed):
        sid = engine.create_session("a", seed=seed).session_id
        sids.append(sid)
        queues.append(engine.events(sid))
        return sid

    try:
        for op, pick, k in ops:
            seq += 1
            if op == "open":
                try:
                    open_session(pick)
                except CapacityError:
                    pass
                continue
            if not sids:
                continue
            sid = sids[pick % len(sids)]
            command = {"fork": ForkCommand(seq, k), "adopt": AdoptCommand(seq, k - 1),
                       "rewind": RewindCommand(seq, k), "act": ActionCommand(seq, 0.0)}.get(op)
            try:
                if op == "close":
                    engine.close_session(sid)
                    sids.remove(sid)
                else:
                    engine.submit(sid, command)
            except SessionClosedError:
                sids.remove(sid)
            time.sleep(0.002)
        for sid in list(sids):
            try:
                engine.close_session(sid)
            except SessionClosedError:
                pass
        for events in queues:  # a fork may be refused for capacity; nothing may fail
            _, seen = wait_event(events, "closed")
            for event in seen:
                assert event.payload.get("code") != "session_failed", event.payload
        assert not backend.live
        # the whole budget is available again: 3 sessions, then a fork filling the 5 states
        sids.clear()
        first = [open_session(seed) for seed in range(3)][0]
        engine.submit(first, ForkCommand(seq + 1, 2))
        event, seen = wait_event(engine.events(first), "preview")
        assert all(e.kind != "error" for e in seen)
    finally:
        engine.stop()
    assert not backend.live


def test_config_must_fit_the_backend():
    with pytest.raises(ValueError, match="chunk_frames 4 not supported"):
        Engine(EchoBackend(), cfg(chunk_frames=4))
    with pytest.raises(ValueError, match="fps 30 outside"):  # echo's default fps is 30
        Engine(EchoBackend(), EngineConfig(max_fps=20))


# ---------------------------------------------------------------------------- just in time
def test_chunk_starts_at_deadline_minus_planned_generation_time():
    """Hand-worked on a fake clock: 20 fps, chunks of 2, frame 10 presented at t = 1.5 s,
    recent chunk times 30-40 ms (p95 39.55) + 5 ms margin -> start at 1.5 s - 44.55 ms; with
    the buffer bound (4 frames) the start may not be earlier than frame 8's presentation."""
    engine = Engine(EchoBackend(), cfg(fps=20, buffer_max_frames=4, batch_join_frames=1,
                                       jit_margin_ms=5.0))
    sid = engine.create_session("a", seed=1).session_id
    s = engine._sessions[sid]
    ms = 1_000_000
    s.clock.anchor(0, 1000 * ms)  # frame 0 at 1.0 s
    s.frame_index = 10            # frame 10 is due at 1.5 s
    # no history: planned as a whole chunk (100 ms) + 5 ms, clamped by the 4-frame bound
    assert engine.scheduler.plan_ms(s) == pytest.approx(105.0)
    assert engine.scheduler.start_at(s) == 1400 * ms
    for gen in (30.0, 31.0, 32.0, 33.0, 34.0, 35.0, 36.0, 37.0, 38.0, 40.0):
        s.stats.gen_ms.append(gen)
    p95 = float(np.percentile([30, 31, 32, 33, 34, 35, 36, 37, 38, 40], 95))
    assert engine.scheduler.plan_ms(s) == pytest.approx(p95 + 5.0)
    assert engine.scheduler.start_at(s) == 1500 * ms - round((p95 + 5.0) * ms)
    s.stats.gen_ms.extend([900.0] * 10)  # slower than the buffer allows to plan for
    assert engine.scheduler.start_at(s) == 1400 * ms  # frame 8's time: 4 frames ahead at most
    s.stats.gen_ms.clear()
    s.stats.gen_ms.extend([30.0] * 5)  # start at 1.5 s - 35 ms
    s.state = object()  # as if the engine thread had made the backend state
    (request,) = engine.scheduler.requests([s], 1500 * ms - 35 * ms)
    assert request.urgent and request.start_ns == 1500 * ms - 35 * ms
    # within 1 frame: may join
    (request,) = engine.scheduler.requests([s], 1500 * ms - 35 * ms - 40 * ms)
    assert not request.urgent
    assert engine.scheduler.requests([s], 1500 * ms - 35 * ms - 60 * ms) == []  # before: none
    s.state = None


def test_frames_are_generated_just_in_time_not_ahead():
    """Echo backend taking 20 ms per chunk of 2 at 20 fps: each chunk is ready shortly before
    its first frame is presented (never more than its planned time ahead), and presentation
    times follow the clock, 50 ms apart."""
    backend = EchoBackend(delay_s=0.02)
    with Engine(backend, cfg(fps=20, buffer_max_frames=8)) as engine:
        sid = engine.create_session("a", seed=1).session_id
        frames = collect(engine.subscribe(sid, maxlen=1000), 40, timeout=5.0)
        late = engine.metrics()["sessions"][sid]["late_frames"]
    assert len(frames) == 40 and late <= 2
    firsts = [f for f in frames[10:] if f.index % 2 == 0]  # first frame of each chunk
    ahead_ms = [(f.present_ns - f.t_ready_ns) / 1e6 for f in firsts]
    # planned: p95 of ~20 ms + 5 ms margin ahead; the old look-ahead held 6-8 frames (300 ms+)
    assert np.median(ahead_ms) < 40, ahead_ms
    gaps = np.diff([f.present_ns for f in frames[10:]]) / 1e6
    assert np.median(gaps) == pytest.approx(50.0, abs=0.01)


def test_action_arriving_mid_chunk_conditions_the_next_chunk():
    """An action submitted while a chunk is being generated is held by the very next chunk."""
    backend = EchoBackend(delay_s=0.08)  # each chunk takes 80 ms
    with Engine(backend, cfg(fps=20)) as engine:
        sid = engine.create_session("a", seed=1).session_id
        slot = engine.subscribe(sid, maxlen=1000)
        assert len(collect(slot, 4, timeout=5.0)) == 4
        assert wait_for(lambda: len(backend.calls) >= 3)
        calls_before = len(backend.calls)
        assert wait_for(lambda: len(backend.calls) > calls_before)  # a chunk just started
        in_flight = len(backend.calls)
        engine.submit(sid, ActionCommand(1, 0.0, frozenset({"right"})))
        frames = collect(slot, 12, timeout=5.0)
    chunk_of = {f.chunk_index: f for f in frames}
    # chunk_index counts chunks from 0: the chunk in flight is in_flight - 1, the next one
    # in_flight; an action is applied before the next chunk starts
    assert chunk_of[in_flight - 1].action_seq == -1
    assert chunk_of[in_flight].action_seq == 1
    assert chunk_of[in_flight].rgb[0, 0, 0] == keys_to_action(["right"])


def test_mode_switch_and_fps_change_reach_the_frames():
    """settings.mode sets chunk size and steps (explicit values override); settings.fps
    changes the spacing of presentation times (the clock transports and recordings follow)."""
    backend = EchoBackend()
    with Engine(backend, cfg(fps=20)) as engine:
        sid = engine.create_session("a", seed=1).session_id
        slot = engine.subscribe(sid, maxlen=1000)
        events = engine.events(sid)
        engine.submit(sid, SettingsCommand(1, mode="quality"))
        info, _ = wait_event(events, "info")
        # the echo backend has chunks of 2 and 3: quality's 2; its 4 steps
        assert (info.payload["mode"], info.payload["chunk_frames"], info.payload["steps"]) == (
            "quality", 2, 4)
        engine.submit(sid, SettingsCommand(2, mode="responsive", steps=3))
        info, _ = wait_event(events, "info")
        assert (info.payload["mode"], info.payload["chunk_frames"], info.payload["steps"]) == (
            "responsive", 2, 3)
        budget = engine.latency_budget(sid)
        assert budget["mode"] == "responsive" and budget["floor_ms"] == pytest.approx(
            budget["plan_ms"] + budget["wait_ms"], abs=0.11)
        collect(slot, 10)
        engine.submit(sid, SettingsCommand(3, fps=40))
        wait_event(events, "info")
        slot = engine.subscribe(sid, maxlen=1000)
        frames = collect(slot, 30, timeout=5.0)
        engine.submit(sid, SettingsCommand(4, mode="fast"))
        error, _ = wait_event(events, "error")
    assert error.payload["field"] == "mode"
    gaps = np.diff([f.present_ns for f in frames[4:]]) / 1e6
    assert np.median(gaps) == pytest.approx(25.0, abs=0.01)

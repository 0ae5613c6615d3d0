"""One session's work never blocks or degrades another (issue 12, items 1 and 2): prompts are
encoded off the engine thread, coalesced and rate-bounded per session; a slow command does not
degrade the neighbour whose chunk it delayed; the event queue of a client that never reads is
bounded."""

from __future__ import annotations

import threading
import time

import numpy as np

from tests.fixtures.engine import EchoBackend, cfg, collect, drain_events, wait_for
from worldstream.engine.core.api import (
    ActionCommand,
    Event,
    EventQueue,
    ForkCommand,
    PromptCommand,
    SettingsCommand,
)
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.inbox import Apply
from worldstream.engine.core.prompts import PromptPrefetcher


def _item(command, session="s"):
    return Apply(session, command, 0)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_event_queue_bounds_previews_and_events():
    q = EventQueue(maxlen=10, max_previews=2)
    for i in range(5):
        q.put(Event("preview", {"fork_id": i}))
    q.put(Event("info", {"n": 0}))
    kinds = [(e.kind, e.payload) for e in drain_events(q)]
    # only the two newest previews stay, the info event behind them
    assert kinds == [("preview", {"fork_id": 3}), ("preview", {"fork_id": 4}),
                     ("info", {"n": 0})]
    assert q.dropped == 3
    for i in range(25):
        q.put(Event("info", {"n": i}))
    left = drain_events(q)
    assert [e.payload["n"] for e in left] == list(range(15, 25))
    assert q.dropped == 3 + 15


def test_prompts_are_coalesced_and_order_is_kept():
    """While prompt 1 is being encoded: prompts 2 and 3 arrive (3 supersedes 2, never shown),
    then a fork, which waits behind them (it copies the prompt); an action and a setting pass
    at once."""
    forwarded, started, release = [], threading.Event(), threading.Event()

    def prepare(command):
        started.set()
        assert release.wait(5)

    pre = PromptPrefetcher(prepare, forwarded.append, per_s=1000).start()
    try:
        p1, p2, p3 = (PromptCommand(seq=i, t_ms=0, text=f"p{i}") for i in (1, 2, 3))
        fork = ForkCommand(seq=4, k=2)
        action = ActionCommand(seq=5, t_ms=0, keys=frozenset({"left"}))
        setting = SettingsCommand(seq=6, steps=2)
        pre.submit("s", _item(p1))
        assert started.wait(5)
        for command in (p2, p3, fork, action, setting):
            pre.submit("s", _item(command))
        assert [i.command for i in forwarded] == [action, setting]
        release.set()
        assert wait_for(lambda: len(forwarded) == 5)
        assert [i.command for i in forwarded] == [action, setting, p1, p3, fork]
        assert pre.superseded == 1
    finally:
        release.set()
        pre.stop()


def test_a_prompt_flood_is_bounded_per_session():
    """40 prompts in a burst: encoded at most ``per_s`` a second; the last one always wins."""
    clock, prepared, forwarded = _Clock(), [], []
    pre = PromptPrefetcher(lambda c: prepared.append(c.text), forwarded.append, per_s=4,
                           clock=clock).start()
    try:
        pre.submit("flood", _item(PromptCommand(seq=0, t_ms=0, text="t0")))
        assert wait_for(lambda: len(forwarded) == 1)
        for i in range(1, 40):
            pre.submit("flood", _item(PromptCommand(seq=i, t_ms=0, text=f"t{i}")))
        time.sleep(0.05)
        # the clock has not advanced: only the first prompt could be encoded so far
        assert prepared == ["t0"] and len(forwarded) == 1
        clock.t = 0.25  # one interval later: the newest waiting prompt, nothing in between
        assert wait_for(lambda: len(forwarded) == 2)
        assert prepared == ["t0", "t39"] and pre.superseded == 38
        # another session is not held back by the flooder's rate
        pre.submit("other", _item(PromptCommand(seq=0, t_ms=0, text="calm")))
        assert wait_for(lambda: "calm" in prepared)
    finally:
        pre.stop()


class PreparingEcho(EchoBackend):
    """EchoBackend with the ``prepare_prompt`` hook; records which threads encode prompts and
    fails the session (set_prompt raises) if a prompt reaches the engine unprepared."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.prepared: set[str] = set()
        self.prepare_threads: set[str] = set()

    def prepare_prompt(self, text, blend_text=None, blend_weight=0.0):
        time.sleep(0.03)  # an encoder's time, spent off the engine thread
        self.prepare_threads.add(threading.current_thread().name)
        self.prepared.add(text)

    def set_prompt(self, state, text, blend_text=None, blend_weight=0.0):
        if text not in self.prepared:
            raise RuntimeError(f"prompt {text!r} reached the engine unencoded")
        super().set_prompt(state, text, blend_text, blend_weight)


def test_engine_encodes_prompts_off_its_thread():
    backend = PreparingEcho()
    with Engine(backend, cfg(fps=30)) as engine:
        sid = engine.create_session("start").session_id
        slot = engine.subscribe(sid, maxlen=64)
        for i in range(5):
            engine.submit(sid, PromptCommand(seq=i, t_ms=0, text=f"scene {i}"))
        # the newest prompt arrives (frames count prompt switches in pixel (0, 0, 2))
        assert wait_for(lambda: any(f.rgb[0, 0, 2] >= 1 and f.prompt_version >= 1
                                    for f in collect(slot, 4, 0.2)), timeout=5)
        assert not any(e.kind == "error" for e in drain_events(engine.events(sid)))
    # the session's first prompt in the caller's thread, the switches on the prefetch thread:
    # never on the engine thread
    assert backend.prepare_threads == {"MainThread", "prompt-prefetch"}
    assert "scene 4" in backend.prepared


class SlowPromptEcho(EchoBackend):
    """No ``prepare_prompt`` hook: a prompt costs 150 ms on the engine thread."""

    def set_prompt(self, state, text, blend_text=None, blend_weight=0.0):
        time.sleep(0.15)
        super().set_prompt(state, text, blend_text, blend_weight)


def test_a_neighbours_slow_commands_do_not_degrade_a_session():
    """Session A's prompts stall the engine thread for 150 ms each, so B's chunks come late;
    B's own chunks take no time, so B is not degraded (before: B lost steps and fps)."""
    with Engine(SlowPromptEcho(), cfg(fps=30, degrade_after_misses=2)) as engine:
        a = engine.create_session("a").session_id
        b = engine.create_session("b").session_id
        slot_b = engine.subscribe(b, maxlen=256)
        assert len(collect(slot_b, 4)) == 4
        for i in range(6):
            engine.submit(a, PromptCommand(seq=i, t_ms=0, text=f"a {i}"))
            time.sleep(0.2)
        frames = collect(slot_b, 8)
        metrics = engine.metrics()["sessions"][b]
        assert metrics["late_frames"] > 0  # B's chunks really were late
        assert not metrics["degraded"] and metrics["steps"] == 4
        assert not [e for e in drain_events(engine.events(b)) if e.kind == "degraded"]
        assert np.all([f.rgb[0, 0, 1] == 4 for f in frames])  # still generated at 4 steps

"""The front end's side of media from the replicas (issue 55): what a replica's transport
reports (notes) keeps the front end's session table right — attached while a viewer is, paused
and reaped after the last leaves, recording on ask — and a failover (``moved``) is not a
departure: the session stays unpaused and its recording goes on until the viewer is back."""

from __future__ import annotations

import time

from worldstream.engine.core.api import EventQueue, FrameSlot, SessionInfo
from worldstream.streaming.limits import Limits
from worldstream.streaming.replica_transport import ReplicaWebRTC
from worldstream.streaming.sessions import SessionManager


class _Engine:
    """Just enough of a RayEngine with media on the replicas."""

    capacity = 4
    model_name = "emulated"
    media_on_replicas = True

    def __init__(self):
        self.paused: dict[str, bool] = {}
        self.note_handler = None
        self._n = 0

    def create_session(self, prompt, seed=None, fps=None):
        self._n += 1
        return SessionInfo(f"s{self._n}", 128, 128, 16)

    def set_paused(self, session_id, paused):
        self.paused[session_id] = paused

    def subscribe(self, session_id, maxlen=None):
        return FrameSlot(maxlen or 8)

    def events(self, session_id):
        return EventQueue()

    def close_session(self, session_id):
        pass


def _setup(tmp_path, grace_s=15.0):
    engine = _Engine()
    manager = SessionManager(engine, Limits(detached_grace_s=grace_s), tmp_path)
    transport = ReplicaWebRTC(manager)
    session = manager.create("a meadow")
    return engine, manager, transport, session


def test_notes_attach_and_detach_the_front_ends_session(tmp_path):
    engine, manager, transport, session = _setup(tmp_path)
    sid = session.session_id
    assert engine.note_handler == transport.on_note and engine.paused[sid] is True
    engine.note_handler(sid, {"kind": "transports", "n": 1})
    assert session.transports == 1 and engine.paused[sid] is False
    assert transport.peer_connections(session) == 1
    engine.note_handler(sid, {"kind": "record", "on": True})
    assert session.recorder is not None and session.recorder.running
    engine.note_handler(sid, {"kind": "transports", "n": 0})  # the viewer left
    assert session.transports == 0 and engine.paused[sid] is True
    assert session.recorder is None and session.detached_since is not None
    manager.close_all()
    assert transport.peer_connections(session) == 0  # forgotten with the session


def test_a_moved_session_stays_attached_until_its_viewer_is_back(tmp_path):
    engine, manager, transport, session = _setup(tmp_path)
    sid = session.session_id
    engine.note_handler(sid, {"kind": "transports", "n": 1})
    engine.note_handler(sid, {"kind": "record", "on": True})
    engine.note_handler(sid, {"kind": "transports", "n": 0, "moved": True})  # failover
    assert session.transports == 1 and engine.paused[sid] is False
    assert session.recorder is not None  # the recording goes on across the move
    engine.note_handler(sid, {"kind": "transports", "n": 1})  # the new offer connected
    assert session.transports == 1 and engine.paused[sid] is False
    engine.note_handler(sid, {"kind": "transports", "n": 0})
    assert session.transports == 0 and engine.paused[sid] is True
    manager.close_all()


def test_a_moved_session_whose_viewer_never_returns_is_detached_after_the_grace(tmp_path):
    engine, manager, transport, session = _setup(tmp_path, grace_s=0.2)
    sid = session.session_id
    engine.note_handler(sid, {"kind": "transports", "n": 1})
    engine.note_handler(sid, {"kind": "transports", "n": 0, "moved": True})
    assert session.transports == 1
    time.sleep(0.6)
    assert session.transports == 0 and engine.paused[sid] is True
    manager.close_all()


def test_activity_reaches_the_idle_reaper_and_unknown_sessions_are_ignored(tmp_path):
    engine, manager, transport, session = _setup(tmp_path)
    before = session.last_active
    engine.note_handler(session.session_id, {"kind": "active"})
    assert session.last_active >= before
    engine.note_handler("nobody", {"kind": "transports", "n": 3})  # closed meanwhile: no-op
    manager.close_all()

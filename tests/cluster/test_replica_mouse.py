"""Mouse motion through engine replicas (Matrix-Game 2.0, tiny random weights, CPU), without
starting Ray: the replica tells the front end its model's world, keys and mouse; the front end
then accepts the model's key names on the wire and tells the page to capture the mouse; an
action's ``pointer`` crosses to the replica (pickled, as Ray carries it) and reaches the
model's per-frame controls; a failover replays the held keys, not the motion already spent."""

from __future__ import annotations

import pickle
import sys
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from tests.app.test_matrix_game_page import engine_config, tiny_backend
from worldstream.app.server import create_app
from worldstream.engine.cluster import replica as replica_module
from worldstream.engine.cluster import router as router_module
from worldstream.engine.cluster.journal import Journal
from worldstream.engine.cluster.placement import Replica, RoutedSession
from worldstream.engine.cluster.replica import EngineReplica
from worldstream.engine.core.api import ActionCommand
from worldstream.streaming import messages as m

ACTION = '{"type":"action","seq":1,"t":0,"keys":["forward","look_up"],"pointer":[12,-3]}'


class _Handle:
    """An actor handle whose ``method.remote(...)`` runs on the replica here, its arguments
    and answer pickled both ways as Ray's are."""

    def __init__(self, replica: EngineReplica):
        self._replica = replica

    def __getattr__(self, name: str):
        def remote(*args):
            answer = getattr(self._replica, name)(*pickle.loads(pickle.dumps(args)))
            return pickle.loads(pickle.dumps(answer))

        return SimpleNamespace(remote=remote)


class _Pool:
    """The router's pool with one replica in this process (what ``RayEngine.start`` asks)."""

    def __init__(self, replica: EngineReplica):
        self.replicas: dict[int, Replica] = {}
        self._replica = replica

    def open(self) -> None:
        pass

    def launch(self) -> Replica:
        return Replica(0, _Handle(self._replica), {})

    def await_ready(self, rep: Replica, pump) -> None:
        rep.info = rep.handle.describe.remote()
        self.replicas[rep.id] = rep


@pytest.fixture
def cluster(monkeypatch):
    jobs = []
    backend = tiny_backend("universal")
    generate = backend.generate
    backend.generate = lambda batch: jobs.extend(batch) or generate(batch)
    monkeypatch.setattr(replica_module, "load_backend", lambda name, **kw: backend)
    replica = EngineReplica("matrix-game-2:universal", engine_config())
    front = router_module.RayEngine("matrix-game-2:universal", config=engine_config())
    front._pool = _Pool(replica)
    front._replicas = front._pool.replicas
    front._watch_hosts = front._monitor_loop = lambda: None  # no Ray cluster to watch
    monkeypatch.setattr(router_module, "init_ray", lambda *args: False)
    try:
        yield front.start(), replica, jobs
    finally:
        replica.stop()
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()  # nothing here started Ray


def test_the_front_end_takes_the_models_keys_and_mouse_from_its_replica(cluster):
    front, replica, _ = cluster
    assert (front.world, front.mouse, front.controls["variant"]) == ("game", True, "universal")
    assert front.wire_keys == replica.engine.wire_keys and "look_up" in front.wire_keys
    with pytest.raises(m.MessageError):  # the direction keys alone: the model's were refused
        m.parse_client_message(ACTION, None)
    with TestClient(create_app(front, ui=False)) as client:
        controls = client.get("/api/controls").json()
    assert controls["mouse"] is True and controls["keys"]["KeyW"] == "forward"


def test_an_actions_pointer_reaches_the_model_on_the_replica(cluster):
    front, replica, jobs = cluster
    info = replica.create_session("play", seed=1, fps=None)
    journal = Journal("play", 1, info.fps)
    front._sessions["s"] = RoutedSession(info, 0, info.session_id, journal)
    front.submit("s", m.to_command(m.parse_client_message(ACTION, front.wire_keys)))
    deadline = time.monotonic() + 120
    while not any(j.controls[0][-2] for j in list(jobs)):
        assert time.monotonic() < deadline, "no chunk took the motion"
        time.sleep(0.05)
    moved = [j for j in jobs if j.controls[0][-2]]
    assert len(moved) == 1  # the motion goes to one chunk, once
    rows = moved[0].controls
    # 0.01 camera units per pixel (up is positive pitch); forward and look_up held
    assert sum(r[-2] for r in rows) == pytest.approx(0.12)
    assert sum(r[-1] for r in rows) == pytest.approx(0.03)
    keys = replica.engine.backend.variant.keys
    assert rows[-1][keys.index("forward")] == rows[-1][keys.index("look_up")] == 1.0
    # a failover re-sends the held keys; the motion was spent on the dead replica
    (again,) = journal.replay()
    assert again == ActionCommand(1, 0.0, frozenset({"forward", "look_up"}))

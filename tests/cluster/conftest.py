"""Fixtures of the cluster tests: a local Ray with two emulated media replicas behind one front
end (module scope: started and stopped once per test module)."""

import pytest

from worldstream.bench.e2e_server import LocalServer
from worldstream.engine.core.config import EngineConfig
from worldstream.streaming.limits import Limits


@pytest.fixture(scope="module")
def media_cluster():
    """``(engine, server)``: a ``RayEngine`` of two ``MediaReplica``s (WebRTC and WebSocket
    served from each replica's process, failover after 2 s of silence) and a ``LocalServer``
    with the page. Ray is shut down afterwards."""
    ray = pytest.importorskip("ray")
    from worldstream.engine.cluster.router import RayEngine
    from worldstream.streaming.replica_media import MediaReplica

    engine = RayEngine("emulated", replicas=2, threads=None, monitor_period_s=0.5,
                       hang_after_s=2.0, replica_cls=MediaReplica,
                       config=EngineConfig(max_sessions=4, fps=16, mode="responsive")).start()
    # the reaper is not under test here (test_replica_transport tests it): about 1 run in 10-25
    # (before and after f16eef1) the replicas' pull stalls for ~2 min, and the 120 s idle
    # timeout then closed the test's session under it
    server = LocalServer(engine, Limits(max_sessions=8, creations_per_s=50,
                                        idle_timeout_s=900.0), ui=True).__enter__()
    yield engine, server
    server.__exit__(None, None, None)
    engine.stop()
    assert not ray.is_initialized()

"""A family installed from outside plays on two Ray replicas (issue 73): each replica is a
process of its own that builds its backend by name, so it must find the same row in the
installed metadata (``worldstream.families``) as the front end; a replica killed with SIGKILL
leaves its session to the other."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.core.test_plugin_family import install_example
from tests.fixtures.engine import collect, wait_for
from worldstream.app.cmd_play import play_config
from worldstream.engine.core import registry

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture
def noise_cluster(tmp_path, monkeypatch):
    """Two replicas of ``--model noise``: the example package installed into a folder that
    this process and the replicas (through ``PYTHONPATH``, which Ray's workers inherit)
    import from."""
    from worldstream.engine.cluster.router import RayEngine

    site = install_example(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    sys.path.insert(0, str(site))
    registry.discover()
    assert "noise" in registry.FAMILIES and registry.FAMILIES["noise"].replicas
    engine = RayEngine("noise", replicas=2, config=play_config(max_sessions=2),
                       monitor_period_s=0.5).start()
    try:
        yield engine
    finally:
        engine.stop()
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m.startswith("worldstream_noise")]:
            del sys.modules[name]
        registry.discover()
    assert not ray.is_initialized()


def test_a_plugin_family_plays_on_two_replicas_and_survives_a_kill(noise_cluster):
    cluster = noise_cluster
    a = cluster.create_session("noise", seed=1)
    b = cluster.create_session("more noise", seed=2)
    replicas = cluster.metrics()["replicas"]
    assert len({r["pid"] for r in replicas}) == 2 and os.getpid() not in {
        r["pid"] for r in replicas}
    assert cluster.model_name == "noise"  # as the replicas describe themselves
    slot_a, slot_b = cluster.subscribe(a.session_id, 256), cluster.subscribe(b.session_id, 256)
    first = collect(slot_a, 5, 30)
    assert len(first) == 5 and first[0].rgb.shape == (48, 64, 3)
    assert len(collect(slot_b, 5, 30)) == 5
    victim = next(r for r in cluster.metrics()["replicas"] if a.session_id in r["sessions"])
    before = [f.index for f in collect(slot_a, 3, 30)]
    os.kill(victim["pid"], signal.SIGKILL)
    killed = time.monotonic()
    after = []
    while not [f for f in after if f.index > before[-1] + 8]:
        after += collect(slot_a, 1, 10)
        assert after, "no frame after the kill"
        assert time.monotonic() - killed < 30
    indices = before + [f.index for f in after]
    assert all(y > x for x, y in zip(indices, indices[1:]))
    survivors = [r for r in cluster.metrics()["replicas"] if r["alive"]]
    assert a.session_id in {s for r in survivors for s in r["sessions"]}
    assert len(collect(slot_b, 5, 30)) == 5  # the other session never stopped
    # the autoscaler starts a fresh replica, which finds the plugin's row too
    assert wait_for(lambda: len([r for r in cluster.metrics()["replicas"] if r["alive"]]) == 2,
                    timeout=300)
    cluster.close_session(a.session_id)
    cluster.close_session(b.session_id)

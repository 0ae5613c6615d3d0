"""Where a cluster of ``play --replicas`` listens and how it authenticates (issue 64, item 7),
without starting Ray (the listeners of a started one: ``test_replica_websocket.py``): joining a
cluster on other hosts turns Ray's token authentication on and refuses to join with it
turned off; the replicas of a cluster started here serve media where the front end binds."""

from __future__ import annotations

import pytest

from worldstream.app.cmd_play import media_bind_address
from worldstream.engine.cluster.pool import require_token_auth


def test_joining_another_host_s_cluster_turns_token_auth_on():
    environ: dict[str, str] = {}
    require_token_auth("10.0.0.2:6379", environ)
    assert environ == {"RAY_AUTH_MODE": "token"}
    environ = {"RAY_AUTH_MODE": "token"}
    require_token_auth("[fd00::2]:6379", environ)
    assert environ == {"RAY_AUTH_MODE": "token"}


@pytest.mark.parametrize("mode", ["disabled", "k8s"])
def test_joining_another_host_s_cluster_without_token_auth_is_refused_in_one_line(mode):
    with pytest.raises(ConnectionError, match=f"10.0.0.2:6379 needs Ray's token auth.*"
                                              f"RAY_AUTH_MODE={mode}.*RAY_AUTH_TOKEN") as err:
        require_token_auth("10.0.0.2:6379", {"RAY_AUTH_MODE": mode})
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("address", ["127.0.0.1:6379", "localhost:6379", "auto",
                                     "ray://10.0.0.2:10001"])
def test_a_loopback_auto_or_client_address_is_left_to_ray(address):
    environ = {"RAY_AUTH_MODE": "disabled"}
    require_token_auth(address, environ)
    assert environ == {"RAY_AUTH_MODE": "disabled"}


def test_replicas_on_this_host_serve_media_where_the_front_end_binds():
    assert media_bind_address("127.0.0.1") == "127.0.0.1"
    assert media_bind_address("localhost") == "127.0.0.1"
    assert media_bind_address("[::1]") == "::1"
    assert media_bind_address("10.1.2.3") == "10.1.2.3"
    outward = media_bind_address("0.0.0.0")  # every interface: one clients can be sent to
    assert outward not in ("0.0.0.0", "") and ":" not in outward

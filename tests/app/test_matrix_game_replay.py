"""``worldstream generate --replay LOG`` of a Matrix-Game 2.0 session (tiny random weights,
CPU): the log of a session steered live with keys and mouse motion (and a rewind) replays
through the command to the session's frames, bit for bit; the log's model id names the
variant the registry loads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.app.test_matrix_game_page import engine_config, tiny_backend
from tests.studio.test_replay import record_session
from worldstream.app import cli
from worldstream.engine.core import registry
from worldstream.engine.core.api import ActionCommand, RewindCommand
from worldstream.engine.core.engine import Engine


def _action(seq, keys, pointer=None):
    return ActionCommand(seq, 0.0, frozenset(keys), pointer=pointer)


@pytest.mark.slow
def test_a_live_sessions_log_replays_through_generate_bit_identically(tmp_path, monkeypatch,
                                                                      capsys):
    plan = [(1, _action(1, {"forward"}, (12.0, -3.0))),
            (12, _action(2, {"look_left", "right"}, (-20.0, 5.0))),
            (24, _action(3, set(), (30.0, 0.0))), (26, RewindCommand(4, 1)),
            (28, _action(5, {"back"}, (-7.5, 2.0)))]
    with Engine(tiny_backend("universal"), engine_config()) as engine:
        original, log = record_session(engine, "play", 5, plan, 44, timeout_s=300)
    assert log["model"] == "matrix-game-2:universal"
    assert [e.get("pointer") for e in log["events"] if e["kind"] == "action"] == [
        [12.0, -3.0], [-20.0, 5.0], [30.0, 0.0], [-7.5, 2.0]]
    path = tmp_path / "session.log.json"
    path.write_text(json.dumps(log))
    got, asked = [], []

    def load(name, model_path=None, **kwargs):  # the test's weights in place of the release
        asked.append((name, model_path, kwargs))
        backend = tiny_backend("universal")
        generate = backend.generate

        def keep(jobs):
            results = generate(jobs)
            got.extend(r.frames for r in results)
            return results

        backend.generate = keep
        return backend

    monkeypatch.setattr(registry, "load_backend", load)
    out = tmp_path / "replay.mp4"
    assert cli.main(["generate", "--replay", str(path), "--model-path", "release",
                     "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["frames"] == len(
        original)
    assert asked == [("matrix-game-2:universal", "release", {})]
    assert np.array_equal(np.concatenate(got), original)


def test_the_registry_loads_the_variant_a_log_names(tmp_path):
    with pytest.raises(ValueError, match="variant 'doom'"):
        registry.load_backend("matrix-game-2:doom", model_path=str(tmp_path))
    with pytest.raises(ValueError, match="is variant 'gta_drive', not 'universal'"):
        registry.load_backend("matrix-game-2:gta_drive", variant="universal")
    with pytest.raises(registry.BackendUnavailableError, match="Skywork/Matrix-Game-2.0"):
        registry.load_backend("matrix-game-2:gta_drive", model_path=str(tmp_path),
                              device="cpu")

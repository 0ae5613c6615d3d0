"""What replicas send back, in the front end's terms: studio results and failures as local
futures and exceptions, frames under their public session id, index and clock, and the
replicas' metrics merged under public session ids."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from worldstream.engine.cluster.placement import Replica
from worldstream.engine.core.api import CapacityError, Frame, SessionClosedError
from worldstream.engine.studio.picture import PictureError
from worldstream.engine.studio.savepoint import SavepointError


def studio_error(reply: dict) -> Exception:
    """The local exception of a studio failure a replica sent back as data
    (``EngineReplica.studio``): the same class where the front end has it, its message."""
    name, message = reply["error"], reply["message"]
    if name == "CapacityError":
        return CapacityError(message, reply.get("retry_after_s") or 5.0)
    if name == "SessionClosedError":
        return SessionClosedError(message)
    known: dict[str, type[Exception]] = {"SavepointError": SavepointError,
                                         "PictureError": PictureError,
                                         "TimeoutError": TimeoutError}
    return known.get(name, ValueError)(message)


def studio_future(ref: Any) -> Future:
    """A future of the studio call ``ref`` (a Ray object ref): its value, or the local
    exception of its failure (TimeoutError when the replica died during the call)."""
    out: Future = Future()

    def done(f: Future) -> None:
        try:
            reply = f.result()
        except Exception as err:  # the replica died during the call
            out.set_exception(TimeoutError(f"the session's replica failed ({err!r})"))
            return
        if "error" in reply:
            out.set_exception(studio_error(reply))
        else:
            out.set_result(reply["value"])

    ref.future().add_done_callback(done)
    return out


def public_frame(frame: Frame, session_id: str, index: int, offset_ns: int) -> Frame:
    """A replica's frame under its public session id and index, its times on this clock."""
    return replace(frame, session_id=session_id, index=index,
                   t_ready_ns=frame.t_ready_ns + offset_ns,
                   present_ns=frame.present_ns + offset_ns)


def merge_metrics(replicas: list[Replica], public: dict[tuple[int, str], str]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The replicas' per-session metrics under public ids (``public``: (replica id, remote
    id) -> public id), and one entry per replica."""
    per_session, listed = {}, []
    for rep in replicas:
        m = rep.metrics
        for remote_id, sm in (m.get("sessions") or {}).items():
            sid = public.get((rep.id, remote_id))
            if sid is not None:
                per_session[sid] = sm
        listed.append({
            "id": rep.id, "pid": rep.info.get("pid"), "node": rep.info.get("node"),
            "host": rep.host,
            "alive": rep.alive, "draining": rep.draining_since is not None,
            "sessions": sorted(rep.sessions),
            "chunk_ms_p50": m.get("chunk_ms_p50"), "chunk_ms_p95": m.get("chunk_ms_p95"),
            "failovers": rep.failovers,
            "received": {public[(rep.id, r)]: n for r, n in (m.get("received") or {}).items()
                         if (rep.id, r) in public}})
    return per_session, listed

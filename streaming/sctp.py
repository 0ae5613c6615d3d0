"""Data channels that refuse an oversized message while it arrives.

aiortc's SCTP transport advertises ``a=max-message-size:262144`` and then reassembles a
message of any size (it never checks its own limit): a client that ignores the advertised size
can send 8 MB, which the server buffers in full (about 7,000 chunks, seconds of work) before
the application sees the message and refuses it as ``too_large``. So the server's transport is
made a :class:`BoundedSctpTransport`, which advertises the application's limit and aborts the
association at the first fragment past it, keeping nothing of the message.
"""

from __future__ import annotations

from typing import Any

from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    RTCSctpCapabilities,
    RTCSctpTransport,
    tsn_minus_one,
    tsn_plus_one,
)

from worldstream.streaming.messages import MAX_MESSAGE_BYTES

#: data the peer may have waiting for reassembly, all streams together (several messages held
#: behind a lost packet); the receive window advertised is set to it, so a well-behaved peer
#: never has more in flight
RECEIVE_WINDOW_BYTES = 16 * MAX_MESSAGE_BYTES


def _message_bytes(reassembly: list[Any], chunk: Any) -> int:
    """Size of the message ``chunk`` belongs to as far as it has arrived: the fragments with
    consecutive TSNs around it (RFC 9260 §6.9), back to its first one and on to its last."""
    by_tsn = {c.tsn: c for c in reassembly}
    size, c = len(chunk.user_data), chunk
    while not c.flags & SCTP_DATA_FIRST_FRAG:
        c = by_tsn.get(tsn_minus_one(c.tsn))
        if c is None or c.flags & SCTP_DATA_LAST_FRAG:  # a gap, or the previous message
            break
        size += len(c.user_data)
    c = chunk
    while not c.flags & SCTP_DATA_LAST_FRAG:
        c = by_tsn.get(tsn_plus_one(c.tsn))
        if c is None or c.flags & SCTP_DATA_FIRST_FRAG:
            break
        size += len(c.user_data)
    return size


class BoundedSctpTransport(RTCSctpTransport):
    """An SCTP transport that advertises ``max_message_bytes`` and aborts the association when
    a message grows past it, or the data awaiting reassembly past ``RECEIVE_WINDOW_BYTES``.

    NOTE: RFC 8841 lets a receiver advertise the largest message it accepts; a peer sending a
    larger one breaks the contract, so the association is aborted (an ABORT chunk, the data
    channels closed; the video goes on) rather than the stream reset: a reset waits for the
    rest of the message to arrive, which is what must not be buffered. The override is the one
    place aiortc adds a DATA chunk to its reassembly (``_receive_data_chunk``), checked before
    the chunk is kept; after the abort the transport takes no more packets."""

    max_message_bytes = MAX_MESSAGE_BYTES
    refused = False

    @classmethod
    def getCapabilities(cls) -> RTCSctpCapabilities:
        return RTCSctpCapabilities(maxMessageSize=cls.max_message_bytes)

    async def _receive_data_chunk(self, chunk: Any) -> None:
        if self.refused:
            return
        stream = self._inbound_streams.get(chunk.stream_id)
        held = sum(len(c.user_data) for s in self._inbound_streams.values() for c in s.reassembly)
        if (held + len(chunk.user_data) > RECEIVE_WINDOW_BYTES or _message_bytes(
                stream.reassembly if stream else [], chunk) > self.max_message_bytes):
            self.refused = True
            self._inbound_streams.clear()
            self._sack_needed = False
            await self.stop()  # ABORT sent, data channels closed, no more packets taken
            return
        await super()._receive_data_chunk(chunk)


def bound_data_channels(pc: Any) -> None:
    """Make the SCTP transport of ``pc`` (created by ``setRemoteDescription`` for an offer
    with a data channel; call before ``createAnswer``, which reads its capabilities) a
    :class:`BoundedSctpTransport`.

    NOTE: aiortc creates the transport in a private method of the peer connection, so there is
    no class to pass it; the instance's class is swapped instead (the subclass adds a flag and
    changes two methods). Only the server's connections change: a client in the same process
    (tests, benchmarks) keeps aiortc's transport."""
    sctp = pc.sctp
    if sctp is None:
        return
    sctp.__class__ = BoundedSctpTransport
    sctp._advertised_rwnd = RECEIVE_WINDOW_BYTES  # sent in the INIT when the association starts

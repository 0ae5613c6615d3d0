// worldstream page add-on (issue 55): the page's WebRTC recovers when its media stops. With
// `play --replicas N --media-from replica` a session's peer connection lives on its replica's
// host and dies with it; the front end moves the session to another replica (failover) and
// answers a new offer to the same session from there (503 + Retry-After while the move is under
// way); that connection's data channel carries the `recovered` event
// (streaming/PROTOCOL_EXTENSIONS.md, "Media from the replicas' hosts"). A watchdog here takes
// the connection for gone when ICE is failed/disconnected for ICE_GRACE_MS, the data channel
// closes, or neither a frame nor a message came for SILENCE_MS; it then offers again with the
// session's token (play.js's worldstream.connectPeer): same <video>, HUD counters kept, a
// bounded number of offers. Never for a session the user closed (Restart, leaving the page)
// or one that has ended (a 404, the server's `closed`).
(() => {
  "use strict";
  const TICK_MS = 100;
  const ICE_GRACE_MS = 500;       // ICE failed/disconnected this long: the connection is gone
  // neither a frame nor a data-channel message this long: gone (frames come every 1/fps s and
  // `stats` every second, both stop when the replica does; a hidden tab presents no frames
  // but still gets its messages, so it is not mistaken for one)
  const SILENCE_MS = 600;
  const MAX_OFFERS = 20;          // per recovery: a move answers 503 for about a second
  const FRAME_TIMEOUT_MS = 4000;  // a new connection with no frame by then: offer again

  let badSince = null, busy = false;

  // why the current connection is taken for gone, or null
  function stopped(S, now) {
    const ice = S.pc.iceConnectionState;
    if (ice === "failed" || ice === "disconnected") {
      if (badSince === null) badSince = now;
      if (now - badSince >= ICE_GRACE_MS) return `ICE ${ice}`;
    } else {
      badSince = null;
    }
    if (S.dc && S.dc.readyState !== "open") return "data channel closed";
    const last = Math.max(S.lastFrameAt, S.lastMessageAt);
    if (last && now - last >= SILENCE_MS) return `nothing for ${Math.round(now - last)} ms`;
    return null;
  }

  function watch() {
    const S = window.worldstream;
    if (busy || S.connecting || S.closing || S.ended || !S.session || S.session.closed
        || S.transport !== "webrtc" || !S.pc) {
      badSince = null;
      return;
    }
    const why = stopped(S, performance.now());
    if (why) recover(S, why);
  }

  async function recover(S, why) {
    busy = true;
    const session = S.session, t0 = performance.now();
    const live = () => S.session === session && !session.closed && !S.closing && !S.ended;
    const since = S.recovered.length;
    S.reconnects.push({ at: t0, why, offers: 0, ok: false });
    const attempt = S.reconnects[S.reconnects.length - 1];
    S.setBadge("reconnecting…", "reconnecting");
    S.log(`media stopped (${why}): reconnecting…`);
    S.dropPeer();  // late messages of the old connection must not pass for the new one's
    try {
      await S.reconnectLoop(attempt, "offers", MAX_OFFERS, live, async () => {
        const pc = await S.connectPeer(FRAME_TIMEOUT_MS);
        if (!live()) { if (S.pc === pc) S.dropPeer(); return; }
        attempt.ok = true;
        attempt.ms = performance.now() - t0;
        S.setBadge("WebRTC", "webrtc");  // the stats poll names the codec again
        const moved = S.recovered.length > since ? " (the session moved: recovered)" : "";
        S.log(`reconnected in ${(attempt.ms / 1000).toFixed(1)} s${moved}`);
      });
    } finally {
      busy = false;
    }
  }

  function onEvent(msg) {
    if (msg.kind !== "recovered") return;
    const S = window.worldstream;
    S.recovered.push({ at: performance.now(), ...msg });
    S.log(`recovered: the session moved to replica ${msg.replica}`
      + `${msg.host ? ` (${msg.host})` : ""} from replica ${msg.from_replica}, `
      + `${msg.context_frames} frames of context`);
  }

  // play.js defines window.worldstream (deferred scripts run in order); mount once it has
  const waitForPage = setInterval(() => {
    const S = window.worldstream;
    if (!S || !S.connectPeer) return;
    clearInterval(waitForPage);
    Object.assign(S, { reconnects: [], recovered: [] });  // read by tests
    S.listeners.event.push(onEvent);
    setInterval(watch, TICK_MS);
  }, 100);
})();

// worldstream page: which frame each presented video frame was and the action-to-photon
// sample it gives (issue 15's latency HUD reads S.a2p). Uses play.js's page state
// (window.worldstream); play.js calls S.onPresented, S.presentedEarly and S.onVideoFrame.
(() => {
  "use strict";
  const SAMPLES = 100;              // rolling window of latency samples
  const $ = (id) => document.getElementById(id);
  const S = window.worldstream;
  const push = (arr, v, n) => { arr.push(v); if (arr.length > n) arr.shift(); };
  const emit = (kind, ...args) => S.listeners[kind].forEach((fn) => fn(...args));

  // ------------------------------------------------------------------ presentation + latency
  // A frame was shown at `shownAt` (performance.now() clock). The first frame conditioned on a
  // newer action gives one action-to-photon sample: shownAt - the time the action was sent.
  // md: the requestVideoFrameCallback metadata (WebRTC only)
  function onPresented(meta, shownAt, md) {
    push(S.presented, shownAt, 60);
    emit("presented", meta, shownAt, md);
    if (meta.action_seq > S.lastActionSeq) {
      S.lastActionSeq = meta.action_seq;
      const sentAt = S.sentAt.get(meta.action_seq) ?? meta.action_t;
      if (sentAt != null) push(S.a2p, shownAt - sentAt, SAMPLES);
    }
  }

  // the value of `map` at RTP timestamp `pts` or one tick either side
  const nearKey = (map, pts) => map.get(pts) ?? map.get((pts + 1) >>> 0)
    ?? map.get((pts - 1) >>> 0);

  // A `frame` message whose video frame was already presented: that presentation counts now
  // (the data channel is ordered, so such frames still reach onPresented in stream order).
  function presentedEarly(msg) {
    const early = nearKey(S.shownEarly, msg.rtp_ts);
    if (!early) return;
    S.shownEarly.delete(early.pts);
    S.misses = 0;
    onPresented(msg, early.shownAt, early.md);
  }

  // WebRTC: match each presented frame to its `frame` message by RTP timestamp. aiortc adds a
  // random origin to the RTP clock (RFC 3550); the first frame presented is pts 0 (the stream's
  // first keyframe; the callback is registered before any frame arrives), which gives the
  // origin; a run of misses recalibrates.
  function onVideoFrame(now, md) {
    S.lastFrameAt = now;
    if (S.onFirstFrame) { S.onFirstFrame(); S.onFirstFrame = null; }
    if (S.pc && md.rtpTimestamp !== undefined) {
      if (S.rtpOrigin === null) {
        // first frame: pts 0; after a run of misses: the newest frame message received
        const pts = S.frames.size && S.recalibrating ? Math.max(...S.frames.keys()) : 0;
        S.rtpOrigin = (md.rtpTimestamp - pts) >>> 0;
      }
      // NOTE: Chromium's rtpTimestamp has been through microseconds and lands a tick (11 us)
      // below the frame's RTP timestamp on every third frame at 15 fps; matching exactly
      // skipped those frames (the HUD showed 5-10 fps of 15 received) and counted an
      // action's photon on a later frame (+67-133 ms)
      const pts = (md.rtpTimestamp - S.rtpOrigin) >>> 0;
      const meta = nearKey(S.frames, pts);
      if (meta) {
        S.misses = 0;
        onPresented(meta, md.expectedDisplayTime || now, md);
      } else {
        // on a loaded machine the video can outrun its `frame` message (RTP vs the data
        // channel): keep the photon time until the message arrives (presentedEarly)
        S.shownEarly.set(pts, { pts, shownAt: md.expectedDisplayTime || now, md });
        if (S.shownEarly.size > 60) S.shownEarly.delete(S.shownEarly.keys().next().value);
        if (++S.misses > 30) {
          S.rtpOrigin = null;
          S.recalibrating = true;
          S.misses = 0;
          S.shownEarly.clear();
        }
      }
    }
    S.rvfc = $("ws-video").requestVideoFrameCallback(onVideoFrame);
  }

  S.onPresented = onPresented;
  S.presentedEarly = presentedEarly;
  S.onVideoFrame = onVideoFrame;
})();

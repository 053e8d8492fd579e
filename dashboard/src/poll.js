// Polling: the callback runs, then again `every` ms after it started (never two at once), while `enabled`;
// the fetch it is given is aborted when the view goes.
import { useEffect, useRef } from "preact/hooks";

export function usePoll(callback, every, enabled) {
  const saved = useRef(callback);
  saved.current = callback;
  useEffect(() => {
    if (!enabled) return undefined;
    let stopped = false;
    let timer = 0;
    const abort = new AbortController();
    async function tick() {
      const started = performance.now();
      try {
        await saved.current(abort.signal);
      } catch (_) {
        /* shown by the callback; keep polling */
      }
      if (!stopped) timer = setTimeout(tick, Math.max(0, every - (performance.now() - started)));
    }
    tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
      abort.abort();
    };
  }, [every, enabled]);
}

// Keel console: live updates by polling; the server renders every fragment (no build step).
"use strict";

const FINISHED = new Set(["completed", "failed", "cancelled"]);

function busy(section) {
  // Never replace a part of the page someone is typing in.
  if (section.contains(document.activeElement) && document.activeElement !== document.body) {
    return true;
  }
  return Array.from(section.querySelectorAll("input[type=text], input:not([type]), textarea"))
    .some((field) => field.value !== "");
}

// The parts of a page that follow it: each is swapped for the part of the same id in the page
// fetched again (the template gives it that id, so the fresh copy carries it and its marks).
const LIVE = "[data-live], [data-live-reload]";

async function refreshSections() {
  const response = await fetch(window.location.href, { credentials: "same-origin" });
  if (!response.ok) return;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  for (const section of document.querySelectorAll(LIVE)) {
    const next = section.id ? fresh.getElementById(section.id) : null;
    if (next && !busy(section)) section.replaceWith(next);
  }
}

function followRun(root) {
  const url = `/ui/runs/${encodeURIComponent(root.dataset.runId)}/live.json`;
  let quietPolls = 0;
  async function poll() {
    try {
      const after = root.dataset.lastEvent || "0";
      const response = await fetch(`${url}?after=${after}`, { credentials: "same-origin" });
      if (response.ok) {
        const live = await response.json();
        if (String(live.last_event) !== after || live.status !== root.dataset.status) {
          await refreshSections();
          root.dataset.lastEvent = String(live.last_event);
          root.dataset.status = live.status;
          quietPolls = 0;
        } else {
          quietPolls += 1;
        }
        if (FINISHED.has(live.status) && quietPolls > 3) return; // nothing more will happen
      }
    } catch (err) {
      // The server restarts or the network blips: try again at the next tick.
    }
    window.setTimeout(poll, quietPolls > 30 ? 5000 : 1000);
  }
  window.setTimeout(poll, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  const run = document.getElementById("run");
  if (run) followRun(run);
  const reloading = document.querySelector("[data-live-reload]");
  if (reloading) {
    const seconds = Number(reloading.dataset.liveReload) || 5;
    window.setInterval(() => refreshSections().catch(() => null), seconds * 1000);
  }
});

// berth's live dashboard: polls the JSON API once a second and redraws three tables; a
// workload's "logs" link (#logs=ID) opens its output below them, followed while it is open.
//
// Read-only.  Every value from the API (node names, commands, explanations) is inserted as
// text (textContent / createTextNode), never as markup, so a workload named "<script>" shows
// as those characters.  The session travels in the HttpOnly cookie the page's URL set; every
// call also sends the session's CSRF value, which the page embeds (<meta name="berth-csrf">),
// as X-Berth-CSRF: the API refuses a write the cookie authenticates without it, or from
// another origin.  The calls keep their Origin ("same-origin" referrer policy: the page's own
// no-referrer would send "Origin: null" on a write).
"use strict";

(function () {
  const PERIOD_MS = 1000;
  const CSRF = (document.querySelector('meta[name="berth-csrf"]') || {}).content || "";
  const PLACEMENTS = 25;
  const MAX_WORKLOADS = 200;
  const LOG_READS = 8; // chunks read per poll at the most (the API's default chunk is 64 KiB)
  const LOG_CHARS = 1 << 20; // the panel keeps the last MiB or so; `berth logs` has it all
  let polls = 0;
  let shown = { id: null, offset: 0 }; // the workload whose output is open, and how far read
  let reading = false; // one read of it at a time (a poll and a click may overlap)
  let states = new Map(); // workload id → its state, as the last poll saw it

  function el(tag, attributes, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "title") node.title = value;
      else if (key === "href") node.setAttribute("href", value);
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node.style.setProperty(key, value);
    }
    for (const child of children || []) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  function bytes(value) {
    let amount = Number(value) || 0;
    let unit = 0;
    while (amount >= 1024 && unit < UNITS.length - 1) {
      amount /= 1024;
      unit += 1;
    }
    const digits = unit === 0 || amount >= 100 ? 0 : amount >= 10 ? 1 : 2;
    return amount.toFixed(digits).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "") + UNITS[unit];
  }

  function rate(value) {
    return bytes(value) + "/s";
  }

  function percent(fraction) {
    return (100 * fraction).toFixed(fraction > 0 && fraction < 0.1 ? 1 : 0) + "%";
  }

  function ratio(used, total) {
    const fraction = total > 0 ? used / total : 0;
    return Math.max(0, Math.min(1, Number.isFinite(fraction) ? fraction : 0));
  }

  // A bar: the filled share of ``fraction``, and a caption under it.
  function bar(fraction, caption, hint) {
    const level = fraction >= 0.9 ? "high" : fraction >= 0.7 ? "mid" : "low";
    const fill = el("span", { class: "fill " + level, width: (100 * fraction).toFixed(1) + "%" });
    return el("div", { class: "meter", title: hint || caption }, [
      el("span", { class: "track" }, [fill]),
      el("span", { class: "caption", text: caption }),
    ]);
  }

  function cell(content, className) {
    const td = el("td", className ? { class: className } : {});
    if (content instanceof Node) td.append(content);
    else td.textContent = content === undefined || content === null ? "–" : String(content);
    return td;
  }

  function badge(text, kind) {
    return el("span", { class: "badge " + kind, text: text });
  }

  function quoted(argv) {
    return (argv || [])
      .map((word) => (/^[\w@%+=:,./-]+$/.test(word) ? word : "'" + word.replace(/'/g, "'\\''") + "'"))
      .join(" ");
  }

  function age(createdAt) {
    const seconds = Math.max(0, Date.now() / 1000 - Number(createdAt));
    if (!Number.isFinite(seconds)) return "–";
    if (seconds < 60) return Math.floor(seconds) + "s";
    if (seconds < 3600) return Math.floor(seconds / 60) + "m";
    if (seconds < 86400) return Math.floor(seconds / 3600) + "h";
    return Math.floor(seconds / 86400) + "d";
  }

  function clock(at) {
    const when = new Date(Number(at) * 1000);
    return Number.isNaN(when.getTime()) ? "–" : when.toLocaleTimeString();
  }

  function fill(tableId, rows, emptyText, columns) {
    const body = document.querySelector("#" + tableId + " tbody");
    if (rows.length === 0) {
      const td = el("td", { text: emptyText });
      td.colSpan = columns;
      body.replaceChildren(el("tr", { class: "empty" }, [td]));
      return;
    }
    body.replaceChildren(...rows);
  }

  function nodeRow(node) {
    const mem = ratio(node.mem_reserved, node.mem_max);
    const disk = ratio(node.disk_reserved, node.disk_max);
    const cpu = ratio(node.cpu_load, 1);
    const diskBw = ratio(node.disk_bw_load, node.disk_bw_ceiling);
    const netBw = ratio(node.net_bw_load, node.net_bw_ceiling);
    const row = el("tr", { "data-node": node.name }, [
      cell(node.name, "name"),
      cell(node.platform, "mono"),
      cell(node.cordoned ? badge("cordoned", "warn") : badge("ready", "ok")),
      cell(bar(mem, bytes(node.mem_reserved) + " / " + bytes(node.mem_max))),
      cell(bar(disk, bytes(node.disk_reserved) + " / " + bytes(node.disk_max))),
      cell(bar(cpu, percent(cpu) + " of " + node.cpu_capacity + " cores")),
      cell(bar(diskBw, rate(node.disk_bw_load) + " / " + rate(node.disk_bw_ceiling))),
      cell(bar(netBw, rate(node.net_bw_load) + " / " + rate(node.net_bw_ceiling))),
      cell(node.layers, "num"),
      cell(node.workloads, "num"),
    ]);
    if (node.cordoned) row.className = "cordoned";
    return row;
  }

  const STATES = {
    pending: "warn", running: "ok", unknown: "warn",
    exited: "muted", stopped: "muted", failed: "bad", lost: "bad",
  };

  function workloadRow(item) {
    const key = item.namespace + "/" + item.name + "/" + item.replica;
    const state = item.exit_code === null || item.exit_code === undefined
      ? item.state : item.state + " (" + item.exit_code + ")";
    return el("tr", { "data-workload": item.id }, [
      cell(item.id, "mono"),
      cell(key),
      cell(item.node),
      cell(badge(state, STATES[item.state] || "muted")),
      cell(item.image),
      cell(quoted(item.command), "mono command"),
      cell(bytes(item.colocated_bytes), "num"),
      cell(age(item.created_at), "num"),
      cell(el("a", { href: "#logs=" + encodeURIComponent(item.id), text: "logs" })),
    ]);
  }

  const OUTCOMES = { placed: "ok", no_capacity: "warn", invalid: "bad", unavailable: "bad" };

  function placementRow(item) {
    return el("tr", {}, [
      cell(clock(item.at), "num"),
      cell(item.namespace + "/" + item.name + (item.workload_id ? " · " + item.workload_id : "")),
      cell(badge(item.outcome, OUTCOMES[item.outcome] || "muted")),
      cell(item.node),
      cell(bytes(item.colocated_bytes), "num"),
      cell(item.rank, "num"),
      cell(item.explanation, "explanation"),
    ]);
  }

  function card(label, value, detail) {
    return el("div", { class: "card" }, [
      el("div", { class: "label", text: label }),
      el("div", { class: "value", text: value }),
      el("div", { class: "detail", text: detail }),
    ]);
  }

  function summary(nodes, workloads) {
    const cordoned = nodes.filter((node) => node.cordoned).length;
    const sum = (key) => nodes.reduce((total, node) => total + (Number(node[key]) || 0), 0);
    const running = workloads.filter((item) => item.state === "running").length;
    const platforms = new Set(nodes.map((node) => node.platform));
    document.getElementById("summary").replaceChildren(
      card("nodes", String(nodes.length), cordoned ? cordoned + " cordoned" : "none cordoned"),
      card("platforms", String(platforms.size), [...platforms].sort().join(", ")),
      card("workloads", String(running), "running, of " + workloads.length + " known"),
      card("memory reserved", percent(ratio(sum("mem_reserved"), sum("mem_max"))),
        bytes(sum("mem_reserved")) + " of " + bytes(sum("mem_max"))),
      card("disk reserved", percent(ratio(sum("disk_reserved"), sum("disk_max"))),
        bytes(sum("disk_reserved")) + " of " + bytes(sum("disk_max"))),
    );
  }

  function status(text, kind) {
    const line = document.getElementById("status");
    line.textContent = text;
    line.className = "status " + kind;
  }

  async function get(path) {
    const response = await fetch(path, {
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-Berth-CSRF": CSRF },
      cache: "no-store",
      referrerPolicy: "same-origin",
    });
    if (!response.ok) {
      const error = new Error(path + ": HTTP " + response.status);
      error.status = response.status;
      throw error;
    }
    return response.json();
  }

  // The workload the address names (#logs=ID), or null.
  function wantedLogs() {
    const match = /^#logs=(.+)$/.exec(location.hash);
    if (!match) return null;
    try {
      return decodeURIComponent(match[1]);
    } catch (error) {
      return null;
    }
  }

  // Read the open workload's output from where the panel left off, a few chunks at a time.
  async function pollLogs() {
    if (reading) return; // the next poll goes on from where this one stops
    reading = true;
    try {
      await readLogs();
    } finally {
      reading = false;
    }
  }

  async function readLogs() {
    const id = wantedLogs();
    const section = document.getElementById("logs");
    const text = document.getElementById("logs-text");
    const note = document.getElementById("logs-note");
    if (id === null) {
      section.hidden = true;
      shown = { id: null, offset: 0 };
      return;
    }
    if (id !== shown.id) {
      shown = { id: id, offset: 0 };
      text.textContent = "";
      note.textContent = "reading…";
      document.getElementById("logs-workload").textContent = id;
      section.hidden = false;
      section.scrollIntoView({ block: "nearest" });
    }
    const path = "/v1/workloads/" + encodeURIComponent(id) + "/logs?offset=";
    try {
      for (let read = 0; read < LOG_READS; read += 1) {
        const chunk = await get(path + shown.offset);
        if (wantedLogs() !== id) return; // another workload was opened meanwhile
        if (!chunk.kept) {
          note.textContent = "its node keeps no output for it (the node's runtime writes none)";
          return;
        }
        text.append(chunk.text);
        if (text.textContent.length > LOG_CHARS) {
          text.textContent = "… (earlier output: berth logs " + id + ")\n" +
            text.textContent.slice(-LOG_CHARS);
        }
        const done = chunk.next_offset >= chunk.size || chunk.next_offset === shown.offset;
        shown.offset = chunk.next_offset;
        const state = states.get(id);
        note.textContent = shown.offset + " bytes · " + (state === "running"
          ? "following (berth logs " + id + " -f)" : "workload " + (state || "not listed"));
        if (done) return;
      }
    } catch (error) {
      if (wantedLogs() !== id) return;
      note.textContent = error.status === 404
        ? "no workload " + id + " in the API's records"
        : "cannot read its output (" + error.message + "); retrying…";
    }
  }

  async function poll() {
    try {
      const [nodes, workloads, placements] = await Promise.all([
        get("/v1/nodes"),
        get("/v1/workloads"),
        get("/v1/placements/recent?limit=" + PLACEMENTS),
      ]);
      const nodeItems = nodes.items.slice().sort((a, b) => (a.name < b.name ? -1 : 1));
      // running first, newest first; the rest of a long history is `berth ps`'s
      const workloadItems = workloads.items.slice().sort((a, b) =>
        (a.state !== "running") - (b.state !== "running") || b.created_at - a.created_at);
      const placementItems = placements.items.slice().sort((a, b) => b.at - a.at);
      summary(nodeItems, workloadItems);
      states = new Map(workloadItems.map((item) => [item.id, item.state]));
      fill("nodes", nodeItems.map(nodeRow), "no nodes in the cluster", 10);
      const workloadRows = workloadItems.slice(0, MAX_WORKLOADS).map(workloadRow);
      if (workloadItems.length > MAX_WORKLOADS) {
        const more = el("td", { text: "… and " + (workloadItems.length - MAX_WORKLOADS) +
          " more (berth ps lists them all)" });
        more.colSpan = 9;
        workloadRows.push(el("tr", { class: "empty" }, [more]));
      }
      fill("workloads", workloadRows, "no workloads yet", 9);
      fill("placements", placementItems.map(placementRow), "no placements yet", 7);
      await pollLogs();
      status("live · updated " + new Date().toLocaleTimeString(), "ok");
      document.body.dataset.state = "live";
      polls += 1;
      document.body.dataset.polls = String(polls); // how many times the page has redrawn
    } catch (error) {
      if (error.status === 401) {
        status("not authorized: open the dashboard URL that berth up printed (it carries ?token=…)", "bad");
        document.body.dataset.state = "unauthorized";
      } else {
        status("cannot reach the API (" + error.message + "); retrying…", "bad");
        document.body.dataset.state = "offline";
      }
    }
    setTimeout(poll, PERIOD_MS);
  }

  window.addEventListener("hashchange", () => {
    pollLogs();
  });
  document.getElementById("logs-close").addEventListener("click", (event) => {
    event.preventDefault();
    history.replaceState(null, "", location.pathname + location.search);
    pollLogs();
  });
  poll();
})();

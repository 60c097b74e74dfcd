// Keeps the overview current: polls the JSON API and rewrites numbers, bars and tables in
// place. Only textContent and attributes are written, except for table cells the server
// escaped itself (/api/overview's "rows").
(function () {
  "use strict";
  var body = document.body;
  if (!body || body.getAttribute("data-page") !== "overview") { return; }
  var root = body.getAttribute("data-root") || "";
  var PERIOD_MS = Math.max(100, Number(body.getAttribute("data-poll-ms")) || 5000);

  function setField(name, value) {
    var nodes = document.querySelectorAll('[data-field="' + name + '"]');
    for (var i = 0; i < nodes.length; i++) { nodes[i].textContent = String(value); }
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) { return "no ready job"; }
    if (seconds < 120) { return Math.round(seconds) + " s"; }
    if (seconds < 7200) { return Math.round(seconds / 60) + " min"; }
    if (seconds < 172800) { return (seconds / 3600).toFixed(1) + " h"; }
    return (seconds / 86400).toFixed(1) + " d";
  }

  function bars(throughput) {
    var top = Math.max.apply(null, [1].concat(throughput.done, throughput.failed));
    setField("chart-top", top);
    setField("chart-note", throughput.truncated
      ? " (the most recent " + throughput.cap.toLocaleString("en") + " of each counted)" : "");
    ["done", "failed"].forEach(function (name) {
      throughput[name].forEach(function (value, index) {
        var bar = document.querySelector('[data-bar="' + name + "-" + index + '"]');
        if (!bar) { return; }
        var h = Math.round(value / top * 120);
        bar.setAttribute("y", String(140 - h));
        bar.setAttribute("height", String(h));
        var title = bar.querySelector("title");
        if (title) { title.textContent = value + " " + name; }
      });
    });
  }

  function table(name, rows) {
    var tbody = document.querySelector('tbody[data-table="' + name + '"]');
    if (!tbody) { return; }
    // the cells are HTML the server escaped (the same builder as the first render)
    var template = document.createElement("template");
    template.innerHTML = rows.map(function (row) {
      return "<tr>" + row.map(function (cell) { return "<td>" + cell + "</td>"; }).join("") + "</tr>";
    }).join("");
    tbody.replaceChildren(template.content);
  }

  function apply(data) {
    Object.keys(data.counts).forEach(function (state) {
      if (typeof data.counts[state] === "number") { setField("counts." + state, data.counts[state]); }
    });
    Object.keys(data.due).forEach(function (key) { setField("due." + key, data.due[key]); });
    setField("oldest", age(data.oldest_ready.age_seconds));
    setField("now", data.now);
    bars(data.throughput);
    Object.keys(data.rows).forEach(function (name) {
      // the per-queue counts come from /api/queues until they have been counted once
      if (name !== "queues" || data.queues_as_of) { table(name, data.rows[name]); }
    });
  }

  // the per-queue counts: a statement per queue over all its jobs, so counted apart
  // from the overview, and at most every QUEUES_MS (the server keeps them as long)
  var QUEUES_MS = 30000;
  function queues() {
    fetch(root + "/api/queues?rows=1", { credentials: "same-origin", cache: "no-store" })
      .then(function (answer) { return answer.ok ? answer.json() : null; })
      .then(function (data) {
        if (data) { table("queues", data.rows); setField("queues-as-of", data.as_of); }
      })
      .catch(function () { /* the next round tries again */ })
      .finally(function () { setTimeout(queues, QUEUES_MS); });
  }
  queues();

  function poll() {
    fetch(root + "/api/overview?rows=1", { credentials: "same-origin", cache: "no-store" })
      .then(function (answer) { return answer.ok ? answer.json() : null; })
      .then(function (data) {
        if (data) { apply(data); body.setAttribute("data-refreshed", data.now); }
      })
      .catch(function () { /* the next poll tries again */ })
      .finally(function () { setTimeout(poll, PERIOD_MS); });
  }
  setTimeout(poll, PERIOD_MS);
})();

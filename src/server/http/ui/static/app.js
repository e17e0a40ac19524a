// The dashboard's script: charts from the JSON blocks the server renders
// (Chart.js), the live region refreshed every 2 s without a reload, and a
// confirmation before every action. No inline script: the pages' Content
// Security Policy allows only these files.
(function () {
  "use strict";
  var REFRESH_MS = 2000;

  function drawCharts(root) {
    if (typeof Chart === "undefined") return;
    root.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      var source = document.getElementById(canvas.dataset.chart);
      if (!source) return;
      var spec;
      try { spec = JSON.parse(source.textContent); } catch (e) { return; }
      var old = Chart.getChart(canvas);
      if (old) old.destroy();
      new Chart(canvas, {
        type: spec.type || "line",
        data: { labels: spec.labels, datasets: spec.datasets },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          interaction: { mode: "index", intersect: false },
          scales: { y: { beginAtZero: true } },
          plugins: { legend: { display: spec.datasets.length > 1 } }
        }
      });
    });
  }

  function destroyCharts(root) {
    if (typeof Chart === "undefined") return;
    root.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      var chart = Chart.getChart(canvas);
      if (chart) chart.destroy();
    });
  }

  var live = document.getElementById("live");
  var updated = document.getElementById("updated");
  var busy = false;

  function refresh() {
    if (!live || busy || document.hidden) return;
    // Do not pull the page from under someone using it.
    var focus = document.activeElement;
    if (focus && focus !== live && live.contains(focus)) return;
    if (live.querySelector("details[open]")) return;
    busy = true;
    fetch(live.dataset.live, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.status === 401) { window.location.reload(); return null; }
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        if (html === null) return;
        destroyCharts(live);
        live.innerHTML = html;
        drawCharts(live);
        if (updated) updated.textContent = "Updated " + new Date().toLocaleTimeString();
      })
      .catch(function (error) {
        if (updated) updated.textContent = "Not updated: " + error.message;
      })
      .then(function () { busy = false; });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });

  function start() {
    drawCharts(document);
    if (live && live.dataset.live) window.setInterval(refresh, REFRESH_MS);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

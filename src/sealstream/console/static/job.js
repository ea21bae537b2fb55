// Refreshes the running job's page from /api/job every 2 s (no framework, no network
// beyond this console).
(function () {
  var root = document.getElementById("job");
  if (!root) return;
  function get(o, path) {
    return path.split(".").reduce(function (a, k) { return a == null ? a : a[k]; }, o);
  }
  function text(v) { return v == null ? "-" : String(v); }
  function refresh() {
    fetch(root.dataset.api, {credentials: "same-origin"}).then(function (r) { return r.json(); })
      .then(function (d) {
        var err = document.getElementById("job-error");
        err.hidden = !!d.ok;
        err.textContent = d.ok ? "" : text(d.error);
        if (d.ok) {
          root.querySelectorAll("[data-f]").forEach(function (el) {
            el.textContent = text(get(d, el.dataset.f));
          });
          var body = document.getElementById("job-parts");
          body.textContent = "";
          (d.partitions || []).forEach(function (p) {
            var tr = document.createElement("tr");
            [p.partition, p.watermark_iso, p.lag].forEach(function (v) {
              var td = document.createElement("td"); td.textContent = text(v); tr.appendChild(td);
            });
            body.appendChild(tr);
          });
        }
        document.getElementById("job-updated").textContent =
          "last refreshed " + new Date().toISOString();
      }).catch(function (e) {
        document.getElementById("job-updated").textContent = "refresh failed: " + e;
      });
  }
  setInterval(refresh, 2000);
  refresh();
})();

(function () {
  "use strict";
  var tables = Array.prototype.slice.call(document.querySelectorAll("table.problems"));
  var q = document.getElementById("q"), show = document.getElementById("show"), count = document.getElementById("count");
  if (!tables.length || !q) return;
  function rows(t) { return Array.prototype.slice.call(t.tBodies[0].rows); }
  function apply() {
    var needle = q.value.trim().toLowerCase(), mode = show.value, shown = 0, total = 0;
    tables.forEach(function (t) {
      rows(t).forEach(function (tr) {
        var ok = (!needle || tr.textContent.toLowerCase().indexOf(needle) >= 0) && (mode === "all" || tr.getAttribute("data-" + mode) === "1");
        tr.hidden = !ok; total += 1; if (ok) shown += 1;
      });
    });
    count.textContent = shown + " of " + total + " rows shown";
  }
  function sortBy(t, col, desc) {
    var th = t.tHead.rows[0].cells[col], num = th.getAttribute("data-type") === "num";
    var list = rows(t).map(function (tr, i) { return [tr.cells[col].getAttribute("data-v"), i, tr]; });
    list.sort(function (a, b) {
      var x = a[0], y = b[0];
      if (x === "" && y !== "") return 1; if (y === "" && x !== "") return -1;
      var c = num ? (+x) - (+y) : x.localeCompare(y, undefined, {numeric: true});
      return (desc ? -c : c) || a[1] - b[1];
    });
    list.forEach(function (e) { t.tBodies[0].appendChild(e[2]); });
    Array.prototype.forEach.call(t.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", desc ? "descending" : "ascending");
  }
  function sortKey(key, desc) {
    tables.forEach(function (t) {
      Array.prototype.forEach.call(t.tHead.rows[0].cells, function (c, i) { if (c.getAttribute("data-key") === key) sortBy(t, i, desc); });
    });
  }
  tables.forEach(function (t) {
    Array.prototype.forEach.call(t.tHead.rows[0].cells, function (th) {
      th.addEventListener("click", function () { sortKey(th.getAttribute("data-key"), th.getAttribute("aria-sort") === "ascending"); });
    });
  });
  q.addEventListener("input", apply); show.addEventListener("change", apply);
  var hash = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
    var i = kv.indexOf("="); if (i > 0) hash[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1));
  });
  if (hash.q) q.value = hash.q;
  if (hash.show) show.value = hash.show;
  if (hash.sort) sortKey(hash.sort, hash.desc === "1");
  apply();
})();

// servesweep HTML report: sortable tables. No network, no dependencies.
(function () {
  "use strict";
  function cellValue(row, col) {
    var cell = row.cells[col];
    if (!cell) return { num: NaN, text: "" };
    var raw = cell.getAttribute("data-v");
    var num = raw === null || raw === "" ? NaN : parseFloat(raw);
    return { num: num, text: cell.textContent || "" };
  }
  function sortTable(table, col, descending) {
    var body = table.tBodies[0];
    if (!body) return;
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, col), y = cellValue(b, col);
      var cmp;
      if (isNaN(x.num) && isNaN(y.num)) cmp = x.text.localeCompare(y.text);
      else if (isNaN(x.num)) return 1; // missing values last, whatever the order
      else if (isNaN(y.num)) return -1;
      else cmp = x.num - y.num;
      return descending ? -cmp : cmp;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    var heads = table.tHead ? table.tHead.rows[0].cells : [];
    for (var i = 0; i < heads.length; i++) {
      heads[i].setAttribute("aria-sort", i === col ? (descending ? "descending" : "ascending") : "none");
    }
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    if (!table.tHead) return;
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.tabIndex = 0;
      var handler = function () {
        sortTable(table, col, th.getAttribute("aria-sort") === "ascending");
      };
      th.addEventListener("click", handler);
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); handler(); }
      });
    });
  });
  // #sort=COLUMN or #sort=COLUMN-desc sorts the results table on load (shareable links).
  var match = /^#sort=(\d+)(-desc)?$/.exec(window.location.hash);
  var results = document.getElementById("results");
  if (match && results) sortTable(results, parseInt(match[1], 10), !!match[2]);
  document.documentElement.setAttribute("data-js", "ok");
})();

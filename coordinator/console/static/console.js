// zkgroups console: refreshes the parts of the page marked data-live every few seconds.
// It asks the server for the same page and moves the server-rendered (escaped) elements in:
// it never builds HTML from data, and it changes nothing on the server (GET only).
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh")) || 0;
  if (!seconds || !document.querySelector("[data-live]") || !window.fetch || !window.DOMParser) {
    return;
  }
  var busy = false;

  function stamp(text) {
    var el = document.getElementById("refresh-stamp");
    if (el) {
      el.textContent = text;
    }
  }

  function swap(text) {
    var fresh = new DOMParser().parseFromString(text, "text/html");
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var next = el.id && fresh.getElementById(el.id);
      if (next) {
        // A copy first: the parsed document's child list is live.
        var nodes = Array.prototype.slice.call(next.childNodes).map(function (node) {
          return document.importNode(node, true);
        });
        el.replaceChildren.apply(el, nodes);
      }
    });
  }

  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.href, {credentials: "same-origin", cache: "no-store", headers: {"Accept": "text/html"}})
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        swap(text);
        stamp("live · updated " + new Date().toLocaleTimeString());
      })
      .catch(function (error) {
        stamp("live · refresh failed (" + error.message + "), retrying");
      })
      .then(function () {
        busy = false;
      });
  }

  stamp("live · every " + seconds + " s");
  window.setInterval(refresh, seconds * 1000);
}());

// The dashboard's live updates and actions. Plain script, no library: the page's
// content is fetched again (?fragment=1) when the site's event stream says
// something it shows changed; the admin token, once entered, is kept in this
// tab's sessionStorage and sent as `Authorization: Bearer`, never in a URL.
"use strict";

(function () {
  const KEY = "jobdist-admin-token";
  const content = document.getElementById("content");
  const live = document.getElementById("live");
  const flash = document.getElementById("flash");
  const login = document.getElementById("login");
  const logout = document.getElementById("logout");
  let pending = null;
  let lastRefresh = 0;
  let latest = 0;  // the newest refresh asked for: an older answer arriving later is dropped

  function token() { return sessionStorage.getItem(KEY); }

  function headers(extra) {
    const all = Object.assign({}, extra || {});
    if (token()) { all.Authorization = "Bearer " + token(); }
    return all;
  }

  function say(text, bad) {
    flash.textContent = text;
    flash.className = bad ? "bad" : "good";
    flash.hidden = false;
  }

  function showLogin() {
    if (!login) { return; }
    login.hidden = Boolean(token());
    logout.hidden = !token();
  }

  async function refresh() {
    pending = null;
    lastRefresh = Date.now();
    const mine = ++latest;
    const url = new URL(location.href);
    url.searchParams.set("fragment", "1");
    let answer;
    try {
      answer = await fetch(url, { headers: headers(), cache: "no-store" });
    } catch (error) {
      live.textContent = "offline";
      return;
    }
    if ((answer.status === 401 || answer.status === 403) && token()) {
      sessionStorage.removeItem(KEY);
      showLogin();
      say("The token was refused; actions are off.", true);
      return refresh();
    }
    const html = await answer.text();
    if (mine === latest) { content.innerHTML = html; }  // rendered and escaped by the server
  }

  // At most one refresh a second, however fast the feed moves.
  function schedule() {
    if (pending) { return; }
    const wait = Math.max(0, 1000 - (Date.now() - lastRefresh));
    pending = setTimeout(refresh, wait);
  }

  function follow() {
    const events = new EventSource("/events");
    events.onopen = function () { live.textContent = "live"; live.className = "feed on"; };
    events.onerror = function () { live.textContent = "reconnecting…"; live.className = "feed"; };
    events.addEventListener("change", function (event) {
      const change = JSON.parse(event.data);
      const shown = content.dataset.live;
      live.title = "feed position " + change.seq;
      if (shown === "*" || change.ids === null || change.ids.includes(shown)) { schedule(); }
    });
  }

  async function act(path, body, question) {
    if (!window.confirm(question)) { return; }
    const answer = await fetch(path, {
      method: "POST", body: JSON.stringify(body),
      headers: headers({ "Content-Type": "application/json" }),
    });
    let reply = {};
    try { reply = await answer.json(); } catch (error) { reply = {}; }
    if (answer.ok) {
      say(reply.message || "done", false);
    } else {
      say(reply.error || ("refused: " + answer.status), true);
    }
    refresh();
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-action]");
    if (button) { act(button.dataset.action, {}, button.dataset.confirm); }
  });

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form.classList.contains("resize")) {
      event.preventDefault();
      const size = Number(form.elements.size.value);
      act(form.dataset.action, { size: size },
          "Resize the worker pool of " + form.dataset.site + " to " + size + "?");
    }
  });

  if (login) {  // (absent when the site has no admin token: no actions to log in to)
    login.addEventListener("submit", function (event) {
      event.preventDefault();
      const field = document.getElementById("token");
      if (field.value) { sessionStorage.setItem(KEY, field.value); }
      field.value = "";
      showLogin();
      refresh();
    });

    logout.addEventListener("click", function () {
      sessionStorage.removeItem(KEY);
      showLogin();
      refresh();
    });
  }

  showLogin();
  if (token()) { refresh(); }
  follow();
})();

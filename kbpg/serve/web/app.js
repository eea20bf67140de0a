// kbpg's search page: calls POST /api/v1/kb/search and shows what kb.search ranked.
// No ranking here: the order, scores and the context block come from the server as they are.
"use strict";

const API = "/api/v1/kb/search";
let token = null; // asked for on a 401, kept in memory only (never stored)
let pending = null; // the search to run again once a token is given

function list(value) {
  const items = value.split(",").map((s) => s.trim()).filter(Boolean);
  return items.length ? items : undefined;
}

// The request, or null (and the reason shown) when the metadata filter is not a JSON object.
function requestBody() {
  const body = { query: $("query").value };
  const filter = $("filter").value.trim();
  if (filter) {
    let parsed = null;
    try {
      parsed = JSON.parse(filter);
    } catch (error) {
      parsed = null;
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      setStatus('The metadata filter must be a JSON object, e.g. {"year": {"$gte": 2020}}.', true);
      $("filter").focus();
      return null;
    }
    body.filter = parsed;
  }
  const groups = list($("groups").value);
  const labels = list($("labels").value);
  const category = $("category").value.trim();
  const top = parseInt($("top").value, 10);
  if (groups) body.groups = groups;
  if (labels) body.labels = labels;
  if (category) body.category = category;
  if (Number.isInteger(top)) body.top = top;
  if ($("graph").checked) body.graph = true;
  return body;
}

function setStatus(text, isError) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", Boolean(isError));
}

function errorText(status, payload) {
  if (payload && payload.message) {
    return payload.message + (payload.hint ? " — " + payload.hint : "");
  }
  if (payload && Array.isArray(payload.detail)) {
    return payload.detail
      .map((e) => (e.loc || []).filter((p) => p !== "body").join(".") + ": " + e.msg)
      .join("; ");
  }
  return "the server answered " + status;
}

// The text as DOM nodes with the query's words in <mark> (text nodes only: content is never
// HTML). The ranges are the server's (kb.highlight: whole words, from the lexemes the lexical arm
// matched), [start, end) offsets in code points, which is how Array.from counts.
function highlighted(text, ranges) {
  const fragment = document.createDocumentFragment();
  const chars = Array.from(text);
  let last = 0;
  for (const [start, end] of ranges || []) {
    fragment.append(chars.slice(last, start).join(""));
    const mark = document.createElement("mark");
    mark.textContent = chars.slice(start, end).join("");
    fragment.append(mark);
    last = end;
  }
  fragment.append(chars.slice(last).join(""));
  return fragment;
}

function armRank(label, rank) {
  const node = element("span", rank == null ? "arm none" : "arm", label + " ");
  node.append(element("b", "", rank == null ? "–" : "#" + rank));
  return node;
}

function showResults(payload) {
  const hits = $("hits");
  hits.replaceChildren();
  for (const chunk of payload.chunks) {
    const item = element("li", "hit");
    item.dataset.chunkId = chunk.chunk_id;
    const head = element("div", "hit-head");
    head.append(element("span", "rank", String(chunk.rank)));
    const title = element("h3", "doc", chunk.document);
    head.append(title);
    item.append(head);
    // a heading path starts with the document's title, already shown above it
    let section = chunk.section || "";
    if (section.startsWith(chunk.document)) {
      section = section.slice(chunk.document.length).replace(/^\s*>\s*/, "");
    }
    if (section) item.append(element("p", "section", section));
    const meta = element("p", "meta");
    meta.append(element("span", "score", "score " + chunk.score.toFixed(4)));
    if (chunk.similarity != null) {
      meta.append(element("span", "similarity", "similarity " + chunk.similarity.toFixed(2)));
    }
    meta.append(armRank("vector", chunk.vector_rank));
    meta.append(armRank("BM25", chunk.lexical_rank));
    meta.append(armRank("graph", chunk.graph_rank));
    meta.append(element("span", "source", chunk.source));
    item.append(meta);
    const text = element("p", "text");
    text.append(highlighted(chunk.content, chunk.highlights));
    item.append(text);
    hits.append(item);
  }
  $("results").hidden = false;
  $("context").textContent = payload.context;
  $("context-box").hidden = payload.chunks.length === 0;
}

async function search(body) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = "Bearer " + token;
  setStatus("Searching…");
  $("go").disabled = true;
  const started = performance.now();
  try {
    const response = await fetch(API, { method: "POST", headers, body: JSON.stringify(body) });
    const payload = await response.json().catch(() => null);
    if (response.status === 401) {
      pending = body;
      token = null;
      $("token-form").hidden = false;
      $("token").focus();
      setStatus("A token is needed to search this server.", true);
      return;
    }
    if (!response.ok) {
      setStatus("Error: " + errorText(response.status, payload), true);
      return;
    }
    showResults(payload);
    const n = payload.chunks.length;
    const ms = Math.round(performance.now() - started);
    setStatus(n ? `${n} result${n === 1 ? "" : "s"} in ${ms} ms` : "No results.");
  } catch (error) {
    setStatus("Error: the server did not answer (" + error.message + ")", true);
  } finally {
    $("go").disabled = false;
  }
}

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!$("query").value.trim()) {
    setStatus("Type a question first.", true);
    $("query").focus();
    return;
  }
  const body = requestBody();
  if (body) search(body);
});

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token").value.trim() || null;
  $("token").value = "";
  $("token-form").hidden = true;
  $("query").focus();
  if (pending) search(pending);
});

$("copy").addEventListener("click", async () => {
  const text = $("context").textContent;
  try {
    await navigator.clipboard.writeText(text);
    setStatus("Context block copied.");
  } catch (error) {
    // no clipboard permission (plain http on another host): select it for Ctrl+C instead
    const range = document.createRange();
    range.selectNodeContents($("context"));
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    $("context").focus();
    setStatus("Context block selected: press Ctrl+C to copy.");
  }
});

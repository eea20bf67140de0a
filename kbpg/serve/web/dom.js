// DOM helpers shared by kbpg's pages (loaded first; text always goes in as text, never HTML).
"use strict";

const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Run by `npm ci` here (the package's postinstall): copies the built xterm.js files the
// terminal page inlines, with their licences, from node_modules/ into vendor/ (git-ignored),
// where the daemon reads them (sandboxd/terminal_page/__init__.py).
"use strict";
const fs = require("fs");
const path = require("path");

const here = __dirname;
const vendor = path.join(here, "vendor");
const files = {
  "xterm.js": "@xterm/xterm/lib/xterm.js",
  "xterm.css": "@xterm/xterm/css/xterm.css",
  "xterm.LICENSE": "@xterm/xterm/LICENSE",
  "addon-fit.js": "@xterm/addon-fit/lib/addon-fit.js",
  "addon-fit.LICENSE": "@xterm/addon-fit/LICENSE",
};
fs.mkdirSync(vendor, { recursive: true });
for (const [name, from] of Object.entries(files)) {
  fs.copyFileSync(path.join(here, "node_modules", from), path.join(vendor, name));
}
console.log(`terminal page: ${Object.keys(files).length} files in ${vendor}`);

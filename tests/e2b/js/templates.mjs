// E2B's template build API of the unmodified JavaScript SDK (`e2b` from npm) against
// sandboxd's E2B front (docs/e2b.rst, "Building templates").
//
//   node templates.mjs
//
// Run by tests/e2b/test_e2b_template_js.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
// pointing at a daemon the test started, TEMPLATE_BASE naming a template of it (busybox and
// bash), TEMPLATE_NAME the template to build and TEMPLATE_CONTEXT a directory holding
// hello.txt. It prints "ok templates" when every check held, and exits non-zero otherwise.

import assert from "node:assert/strict";
import { BuildError, Sandbox, Template } from "e2b";

const base = process.env.TEMPLATE_BASE;
const name = process.env.TEMPLATE_NAME;
const context = process.env.TEMPLATE_CONTEXT;

const logs = [];
const template = Template({ fileContextPath: context })
  .fromTemplate(base)
  .copy("hello.txt", "/opt/js/")
  .setEnvs({ FROM_JS: "yes" })
  .runCmd("cat /opt/js/hello.txt && echo built-by-$FROM_JS")
  .setWorkdir("/opt/js");
const info = await Template.build(template, `${name}:v1`, {
  onBuildLogs: (entry) => logs.push(entry.message),
});
assert.equal(info.name, `${name}:v1`);
assert.ok(logs.includes("built-by-yes"), logs.join("\n"));
assert.equal(await Template.exists(name), true);

const tagged = await Template.assignTags(`${name}:v1`, "stable");
assert.deepEqual(tagged.tags, ["stable"]);
const tags = (await Template.getTags(name)).map((tag) => tag.tag).sort();
assert.deepEqual(tags, ["stable", "v1"]);

const failing = Template().fromTemplate(base).runCmd("echo from-js; exit 4");
const error = await Template.build(failing, `${name}-failed`).then(
  () => null,
  (e) => e,
);
assert.ok(error instanceof BuildError, String(error));
assert.match(error.message, /exited with 4/);

const sbx = await Sandbox.create(`${name}:stable`, { allowInternetAccess: false });
try {
  const result = await sbx.commands.run("cat /opt/js/hello.txt; echo $FROM_JS; pwd");
  assert.equal(result.stdout, "hello from js\nyes\n/opt/js\n");
} finally {
  await sbx.kill();
}
console.log("ok templates");

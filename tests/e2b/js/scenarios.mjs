// Scenarios of the unmodified E2B JavaScript SDK (`e2b` from npm) against sandboxd's E2B front.
//
//   node scenarios.mjs <name>
//
// Run by tests/e2b/test_js_sdk.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at
// a daemon the test started. Each scenario creates its own sandbox and kills it; it prints
// "ok <name>" when every check held, and exits non-zero with the failed check otherwise.

import assert from "node:assert/strict";
import {
  CommandExitError,
  FilesystemEventType,
  InvalidArgumentError,
  NotFoundError,
  RateLimitError,
  Sandbox,
  TimeoutError,
} from "e2b";

const CONCURRENT_MAX = 16; // SANDBOXD_PROCESSES_MAX's default: running commands per sandbox

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function until(check, what, ms = 20000) {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

async function rejection(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error("the call did not fail");
}

const scenarios = {
  // Foreground with live callbacks, a non-zero exit, background + list + kill, stdin.
  async commands(sbx) {
    const out = [];
    const err = [];
    const result = await sbx.commands.run("echo one; sleep 0.3; echo two >&2; echo three", {
      onStdout: (data) => out.push([Date.now(), data]),
      onStderr: (data) => err.push(data),
    });
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, "one\nthree\n");
    assert.equal(out.map(([, data]) => data).join(""), result.stdout);
    assert.equal(err.join(""), "two\n");
    assert.ok(out.length >= 2 && out.at(-1)[0] - out[0][0] >= 200, "stdout arrived live");

    const failed = await rejection(sbx.commands.run("echo partial; exit 3"));
    assert.ok(failed instanceof CommandExitError, String(failed));
    assert.equal(failed.exitCode, 3);
    assert.equal(failed.stdout, "partial\n");

    const background = await sbx.commands.run("sleep 60", { background: true });
    const listed = await sbx.commands.list();
    assert.ok(listed.some((p) => p.pid === background.pid), JSON.stringify(listed));
    assert.equal(await sbx.commands.kill(background.pid), true);
    const killed = await rejection(background.wait());
    assert.ok(killed instanceof CommandExitError, String(killed));
    assert.equal(await sbx.commands.kill(background.pid), false);

    const cat = await sbx.commands.run("cat", { background: true, stdin: true });
    await sbx.commands.sendStdin(cat.pid, "hello ");
    await sbx.commands.sendStdin(cat.pid, "world");
    await sbx.commands.closeStdin(cat.pid);
    assert.equal((await cat.wait()).stdout, "hello world");
  },

  // files.write / files.read, and a streamed watchDir.
  async files(sbx) {
    await sbx.files.write("/home/user/notes/a.txt", "héllo");
    assert.equal(await sbx.files.read("/home/user/notes/a.txt"), "héllo");
    const blob = new Uint8Array(70000).map((_, i) => i % 251);
    await sbx.files.write("/home/user/blob.bin", blob);
    const back = await sbx.files.read("/home/user/blob.bin", { format: "bytes" });
    assert.deepEqual(Buffer.from(back), Buffer.from(blob));
    assert.equal((await sbx.commands.run("cat notes/a.txt")).stdout, "héllo");

    await sbx.files.makeDir("/home/user/watched");
    const seen = [];
    const watch = await sbx.files.watchDir("/home/user/watched", (event) => seen.push(event));
    await sbx.files.write("/home/user/watched/new.txt", "1");
    await until(
      () => seen.some((e) => e.name === "new.txt" && e.type === FilesystemEventType.CREATE),
      "the watch's create event",
    );
    await watch.stop();
  },

  // The 17th concurrent command is the SDK's RateLimitError, and the sandbox lives on.
  async rateLimit(sbx) {
    const running = [];
    for (let n = 0; n < CONCURRENT_MAX; n++) {
      running.push(await sbx.commands.run("sleep 120", { background: true }));
    }
    const refused = await rejection(sbx.commands.run("echo one too many"));
    assert.ok(refused instanceof RateLimitError, `${refused.name}: ${refused.message}`);
    assert.match(refused.message, /processes are running/);
    for (const handle of running) await handle.kill();
    assert.equal((await sbx.commands.run("echo still here")).stdout, "still here\n");
  },

  // A refused argument keeps its message; an unknown pid is not found.
  async invalidArgument(sbx) {
    const refused = await rejection(sbx.commands.run("true", { cwd: "/etc" }));
    assert.ok(refused instanceof InvalidArgumentError, `${refused.name}: ${refused.message}`);
    assert.match(refused.message, /outside the sandbox/);
    const missing = await rejection(sbx.commands.connect(4000000));
    assert.ok(missing instanceof NotFoundError, `${missing.name}: ${missing.message}`);
  },

  // A command that reaches its timeout is the SDK's TimeoutError, not an exit code, and is
  // killed (the SDK's own deadline and the daemon's fall together: either way, a timeout).
  async timeout(sbx) {
    const handle = await sbx.commands.run("sleep 30", { background: true, timeoutMs: 1000 });
    const ended = await rejection(handle.wait());
    assert.ok(ended instanceof TimeoutError, `${ended.name}: ${ended.message}`);
    let left = await sbx.commands.list();
    for (let n = 0; left.length && n < 200; n++) {
      await sleep(50);
      left = await sbx.commands.list();
    }
    assert.deepEqual(left, [], "the command was killed");
  },

  // A sandbox killed while a command runs cuts the command's stream as E2B cuts it; a command
  // started afterwards finds no sandbox.
  async killed(sbx) {
    const handle = await sbx.commands.run("sleep 60", { background: true });
    await Sandbox.kill(sbx.sandboxId);
    const ended = await rejection(handle.wait());
    assert.ok(ended instanceof TimeoutError, `${ended.name}: ${ended.message}`);
    assert.match(ended.message, /end of life while the request was in flight/);
    const gone = await rejection(sbx.commands.run("true"));
    assert.equal(gone.name, "SandboxNotFoundError", gone.message);
  },
};

const name = process.argv[2];
const scenario = scenarios[name];
if (!scenario) {
  console.error(`no scenario ${name}: one of ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
const sbx = await Sandbox.create({ timeoutMs: 120000 });
try {
  await scenario(sbx);
} finally {
  await Sandbox.kill(sbx.sandboxId);
}
console.log(`ok ${name}`);

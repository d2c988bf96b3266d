// The `browser` export in headless Chromium (Debian's, driven by
// playwright-core): nodes in pages join a log service on loopback, keep
// their store in OPFS or IndexedDB under a Web Lock, and resume from it
// after a reload, reading from the service only what came after. Skipped,
// and reported so, where Chromium is not installed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { dirname, extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { MeldDB } from "melddb";
import { startService } from "./service.mjs";

const CHROMIUM = process.env.MELDDB_CHROMIUM ?? "/usr/bin/chromium";
const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm", ".map": "application/json" };

/** Serves the page and the package's dist/ and pkg/ on loopback; `t.after` stops it. */
async function servePackage(t) {
  const server = createServer((req, res) => {
    const path = new URL(req.url ?? "/", "http://x").pathname;
    const file = path === "/" ? join(root, "test", "browser", "page.html") : normalize(join(root, path));
    const allowed = file.startsWith(join(root, "dist")) || file.startsWith(join(root, "pkg")) || file.endsWith("page.html");
    if (!allowed || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
    res.end(readFileSync(file));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => new Promise((resolve) => server.close(resolve)));
  return `http://127.0.0.1:${server.address().port}/`;
}

async function launch(t) {
  const { chromium } = await import("playwright-core");
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  t.after(() => browser.close());
  return browser;
}

async function openPage(context, url) {
  const page = await context.newPage();
  page.on("pageerror", (e) => console.error(`page error: ${e.message}`));
  await page.goto(url);
  await page.waitForFunction(() => document.title === "ready");
  return page;
}

/** In the page: connect with a store, write `n` transactions, flush, report, close. */
function session(page, args) {
  return page.evaluate(async ({ ws, log, name, backend, n, tag }) => {
    const { MeldDB, openBrowserStore } = window.melddb;
    const store = await openBrowserStore(name, { backend });
    const db = await MeldDB.connect(ws, { log, token: "writer", store, checkpointBytes: 2000 });
    const atStart = db.stats();
    for (let i = 0; i < n; i++) await db.transact((tx) => tx.put(`${tag}/${i}`, "v".repeat(200)), { retries: 50 });
    const snap = await db.latest();
    await db.flush();
    const out = { atStart, stats: db.stats(), digest: snap.digest(), pos: snap.pos };
    db.close();
    await db.closed();
    return out;
  }, args);
}

for (const backend of ["opfs", "indexeddb"]) {
  test(`in Chromium a node keeps its store in ${backend} under a Web Lock and resumes from it after a reload`, async (t) => {
    if (!existsSync(CHROMIUM)) {
      t.skip(`no Chromium at ${CHROMIUM} (.ci/run installs Debian's chromium)`);
      return;
    }
    const svc = await startService(t);
    const url = await servePackage(t);
    const browser = await launch(t);
    const context = await browser.newContext();
    const log = `tabs-${backend}`;
    const args = { ws: svc.ws, log, name: `store-${backend}`, backend };

    const page = await openPage(context, url);
    const first = await session(page, { ...args, n: 40, tag: "first" });
    assert.equal(first.atStart.startedAt, 0);
    assert.equal(first.atStart.restored, 0);

    // Another node writes while the tab is away.
    const other = await MeldDB.connect(svc.ws, { log, token: "writer" });
    t.after(() => other.close());
    for (let i = 0; i < 5; i++) await other.transact((tx) => tx.put(`away/${i}`, "x"));
    const tail = (await other.latest()).pos + 1;

    await page.reload();
    await page.waitForFunction(() => document.title === "ready");
    const second = await session(page, { ...args, n: 1, tag: "second" });
    // It melded again what its store held and read only what came after.
    assert.ok(second.atStart.startedAt > 0, `resumed from a checkpoint (started at ${second.atStart.startedAt})`);
    assert.equal(second.atStart.startedAt + 1 + second.atStart.restored, first.stats.nextPos);
    assert.equal(second.atStart.melded, tail - first.stats.nextPos);
    const snap = await other.latest();
    assert.equal(second.pos, snap.pos);
    assert.equal(second.digest, snap.digest());

    // Two pages of one origin never share a store.
    const a = await openPage(context, url);
    const b = await openPage(context, url);
    await a.evaluate(async ({ name, backend }) => {
      window.held = await window.melddb.openBrowserStore(name, { backend });
    }, args);
    const refused = await b.evaluate(async ({ name, backend }) => {
      try {
        await window.melddb.openBrowserStore(name, { backend });
        return "opened";
      } catch (e) {
        return `${e.name}/${e.code}`;
      }
    }, args);
    assert.equal(refused, "MeldStorageError/Locked");
    await a.evaluate(() => window.held.close());
    const reopened = await b.evaluate(async ({ name, backend }) => {
      const s = await window.melddb.openBrowserStore(name, { backend });
      const saved = await s.load();
      await s.close();
      return saved?.log;
    }, args);
    assert.equal(reopened, log);
  });
}

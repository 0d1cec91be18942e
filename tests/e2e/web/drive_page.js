// Drives the web UI in headless Chromium over the DevTools protocol, for tests that need a
// pointer (a drag across the timeline) rather than a page's DOM after load (--dump-dom).
//
//   node --experimental-websocket drive_page.js PROFILE_DIR URL [ACTION]...
//     drag SELECTOR X0 X1   a mouse drag across the element (X0, X1: fractions of its width)
//     screenshot FILE       the page as a PNG
//
// Starts chromium with PROFILE_DIR, opens URL, waits until the page says it loaded
// (body[data-loaded]), runs each action (after a drag, waits for the page to load again), and
// prints one JSON object per state (after load, after each action): the page's address, the
// summary, and the timeline's data attributes; a screenshot adds its file and size.
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');

const [profile, url, ...rest] = process.argv.slice(2);
const deadline = Date.now() + 90_000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function fail(message) {
  console.error(`drive_page: ${message}`);
  process.exit(1);
}

async function devtoolsPort(chrome) {
  const file = path.join(profile, 'DevToolsActivePort');
  while (Date.now() < deadline) {
    if (chrome.exitCode !== null) fail(`chromium exited (${chrome.exitCode})`);
    try {
      const port = fs.readFileSync(file, 'utf8').split('\n')[0];
      if (port) return port;
    } catch (e) { /* not written yet */ }
    await sleep(100);
  }
  fail('chromium did not open its DevTools port');
}

async function main() {
  fs.rmSync(path.join(profile, 'DevToolsActivePort'), { force: true });
  const chrome = spawn('chromium', ['--headless', '--no-sandbox', '--disable-gpu',
    '--disable-quic', '--no-first-run', '--window-size=1280,900', '--remote-debugging-port=0',
    `--user-data-dir=${profile}`, 'about:blank'], { stdio: 'ignore' });
  try {
    const port = await devtoolsPort(chrome);
    const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
    const page = targets.find((t) => t.type === 'page');
    if (!page) fail('no page target');
    const ws = new WebSocket(page.webSocketDebuggerUrl);
    await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
    let next = 1;
    const waiting = new Map();
    const exceptions = [];  // the page's uncaught errors, for failure messages
    ws.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      if (msg.method === 'Runtime.exceptionThrown') {
        exceptions.push(msg.params.exceptionDetails.exception?.description ||
                        msg.params.exceptionDetails.text);
      }
      if (msg.id && waiting.has(msg.id)) {
        const { resolve, reject } = waiting.get(msg.id);
        waiting.delete(msg.id);
        if (msg.error) reject(new Error(JSON.stringify(msg.error)));
        else resolve(msg.result);
      }
    };
    const send = (method, params = {}) => new Promise((resolve, reject) => {
      const id = next++;
      waiting.set(id, { resolve, reject });
      ws.send(JSON.stringify({ id, method, params }));
    });
    const evaluate = async (expression) => {
      const r = await send('Runtime.evaluate', { expression, returnByValue: true });
      if (r.exceptionDetails) fail(`${expression}: ${JSON.stringify(r.exceptionDetails)}`);
      return r.result.value;
    };
    const state = () => evaluate(`(() => {
      const chart = document.getElementById('timeline-chart');
      return { href: location.href, loaded: document.body.dataset.loaded,
               summary: document.getElementById('summary').textContent,
               error: document.getElementById('error').textContent,
               timeline: { ...chart.dataset, bars: chart.querySelectorAll('rect.bar').length },
               legend: document.getElementById('timeline-legend').textContent };
    })()`);
    const report = async () => console.log(JSON.stringify(await state()));
    const waitFor = async (expression, what) => {
      while (Date.now() < deadline) {
        if (await evaluate(expression)) return;
        await sleep(100);
      }
      fail(`timed out waiting for ${what}; the page: ${JSON.stringify(await state())}; ` +
           `its errors: ${JSON.stringify(exceptions)}`);
    };
    // (A page being replaced has no body yet.)
    const loaded = 'document.body && document.body.dataset.loaded && ' +
        'document.getElementById("timeline-chart").dataset.intervals';
    await send('Runtime.enable');
    await send('Page.navigate', { url });
    await waitFor(loaded, 'the page to load');
    await report();
    for (let i = 0; i < rest.length;) {
      const action = rest[i++];
      if (action === 'screenshot') {
        const file = rest[i++];
        const shot = await send('Page.captureScreenshot', { format: 'png' });
        fs.writeFileSync(file, Buffer.from(shot.data, 'base64'));
        console.log(JSON.stringify({ ...(await state()), screenshot: file,
                                     bytes: fs.statSync(file).size }));
        continue;
      }
      if (action !== 'drag') fail(`unknown action ${action}`);
      const [selector, x0, x1] = [rest[i++], Number(rest[i++]), Number(rest[i++])];
      const box = await evaluate(`(() => { const r = document.querySelector(${JSON.stringify(selector)})
          .getBoundingClientRect(); return { left: r.left, top: r.top, width: r.width, height: r.height }; })()`);
      if (!box) fail(`no element ${selector}`);
      // Loaded again, at another address (the page's state is in it).
      const before = await evaluate('delete document.body.dataset.loaded; location.href');
      const reloaded = `${loaded} && location.href !== ${JSON.stringify(before)}`;
      const y = box.top + box.height / 2;
      const at = (f) => box.left + f * box.width;
      await send('Input.dispatchMouseEvent', { type: 'mousePressed', x: at(x0), y, button: 'left', clickCount: 1 });
      for (let k = 1; k <= 5; ++k) {
        await send('Input.dispatchMouseEvent', { type: 'mouseMoved', x: at(x0 + (x1 - x0) * k / 5), y, button: 'left' });
      }
      await send('Input.dispatchMouseEvent', { type: 'mouseReleased', x: at(x1), y, button: 'left', clickCount: 1 });
      await waitFor(reloaded, 'the page to load after the drag');
      await report();
    }
    ws.close();
  } finally {
    chrome.kill('SIGKILL');
  }
}
main().catch((e) => fail(e.stack || e));

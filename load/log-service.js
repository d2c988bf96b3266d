// k6 load test of the log service over its HTTP/JSON API.
//
// Run it through load/run.sh, which starts a service on loopback with
// temporary zone directories, passes BASE_URL and stops the service after.
// Scenarios, all on one log:
//   appenders  open-loop appends of RECORD_BYTES at RATE per second, each
//              with a client id and request id (so a retry is idempotent);
//   readers    random reads of positions already written, content checked;
//   retries    the same request id sent twice must land once (same pos);
//   refusals   bad tokens, a reader appending, an oversized record and a
//              position not yet written are refused with the right status,
//              and the service keeps serving.
// Thresholds make k6 exit non-zero (99) when any check fails, an append or
// read errors, or p99 latency passes P99_MS.
import http from 'k6/http';
import { check, fail } from 'k6';
import exec from 'k6/execution';

const BASE = __ENV.BASE_URL;
const LOG = __ENV.LOG || 'load';
const WRITER = __ENV.WRITER_TOKEN || 'load-writer';
const READER = __ENV.READER_TOKEN || 'load-reader';
const RECORD = parseInt(__ENV.RECORD_BYTES || '1024', 10);
const MAX_RECORD = parseInt(__ENV.MAX_RECORD_BYTES || '65536', 10);
const RATE = parseInt(__ENV.RATE || '400', 10);
const DURATION = __ENV.DURATION || '20s';
const P99_MS = parseInt(__ENV.P99_MS || '250', 10);

export const options = {
  scenarios: {
    appenders: {
      executor: 'constant-arrival-rate',
      exec: 'append',
      rate: RATE,
      timeUnit: '1s',
      duration: DURATION,
      preAllocatedVUs: 32,
      maxVUs: 256,
    },
    readers: {
      executor: 'constant-vus',
      exec: 'read',
      vus: 4,
      duration: DURATION,
      startTime: '1s',
    },
    retries: {
      executor: 'per-vu-iterations',
      exec: 'retry',
      vus: 2,
      iterations: 50,
      maxDuration: DURATION,
    },
    refusals: {
      executor: 'per-vu-iterations',
      exec: 'refuse',
      vus: 1,
      iterations: 10,
      maxDuration: DURATION,
    },
  },
  thresholds: {
    checks: ['rate==1'],
    'http_req_failed{scenario:appenders}': ['rate==0'],
    'http_req_failed{scenario:readers}': ['rate==0'],
    'http_req_duration{scenario:appenders}': [`p(99)<${P99_MS}`],
    'http_req_duration{scenario:readers}': [`p(99)<${P99_MS}`],
    // The open loop must keep its rate: k6 drops iterations when every VU
    // is busy waiting for the service. Less than 1% of the rate may be
    // dropped (a scheduling stall of the machine running k6), no more.
    dropped_iterations: [`rate<${RATE / 100}`],
    // Named so the summary export carries them (the figures run.sh prints).
    'http_reqs{op:append}': ['count>0'],
    'http_reqs{op:read}': ['count>0'],
  },
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
};

const auth = (token) => ({ Authorization: `Bearer ${token}` });

// A record whose first bytes say who wrote it; the rest is filler, so a
// reader can tell a record of this test from anything else.
function record(tag, len) {
  const head = `melddb-load ${tag} `;
  return head + 'x'.repeat(Math.max(0, len - head.length));
}

export function setup() {
  if (!BASE) fail('BASE_URL is not set (run load/run.sh)');
  const h = http.get(`${BASE}/health`);
  if (h.status !== 200) fail(`service not healthy: ${h.status} ${h.body}`);
  return {};
}

export function append() {
  const id = exec.scenario.iterationInTest + 1;
  const r = http.post(`${BASE}/v1/logs/${LOG}/append`, record(`a${id}`, RECORD), {
    headers: Object.assign(auth(WRITER), {
      'x-client-id': '1001',
      'x-request-id': String(id),
      'content-type': 'application/octet-stream',
    }),
    tags: { op: 'append' },
  });
  check(r, {
    'append: 200': (x) => x.status === 200,
    'append: a position': (x) => x.status === 200 && Number.isInteger(x.json('pos')),
  });
}

export function read() {
  const t = http.get(`${BASE}/v1/logs/${LOG}/tail`, { headers: auth(READER), tags: { op: 'tail' } });
  if (!check(t, { 'tail: 200': (x) => x.status === 200 })) return;
  const tail = t.json('tail');
  if (tail < 1) return;
  const pos = Math.floor(Math.random() * tail);
  const r = http.get(`${BASE}/v1/logs/${LOG}/entries/${pos}`, {
    headers: auth(READER),
    responseType: 'text',
    tags: { op: 'read' },
  });
  check(r, {
    'read: 200': (x) => x.status === 200,
    'read: a record of this test': (x) =>
      typeof x.body === 'string' && x.body.startsWith('melddb-load ') && x.body.length === RECORD,
  });
}

export function retry() {
  const id = 1_000_000 + exec.scenario.iterationInTest;
  const params = {
    headers: Object.assign(auth(WRITER), { 'x-client-id': '2002', 'x-request-id': String(id) }),
    tags: { op: 'retry' },
  };
  const body = record(`r${id}`, RECORD);
  const first = http.post(`${BASE}/v1/logs/${LOG}/append`, body, params);
  const again = http.post(`${BASE}/v1/logs/${LOG}/append`, body, params);
  check(again, {
    'retry: both 200': (x) => first.status === 200 && x.status === 200,
    'retry: same position (appended once)': (x) =>
      first.status === 200 && x.status === 200 && x.json('pos') === first.json('pos'),
  });
}

export function refuse() {
  const url = `${BASE}/v1/logs/${LOG}/append`;
  const none = http.post(url, 'x', { tags: { op: 'refused' }, responseCallback: http.expectedStatuses(401) });
  const bad = http.post(url, 'x', {
    headers: auth('not-a-token'),
    tags: { op: 'refused' },
    responseCallback: http.expectedStatuses(401),
  });
  const reader = http.post(url, 'x', {
    headers: auth(READER),
    tags: { op: 'refused' },
    responseCallback: http.expectedStatuses(403),
  });
  const big = http.post(url, 'y'.repeat(MAX_RECORD + 1), {
    headers: auth(WRITER),
    tags: { op: 'refused' },
    responseCallback: http.expectedStatuses(413),
  });
  const ahead = http.get(`${BASE}/v1/logs/${LOG}/entries/999999999`, {
    headers: auth(READER),
    tags: { op: 'refused' },
    responseCallback: http.expectedStatuses(404),
  });
  const health = http.get(`${BASE}/health`, { tags: { op: 'refused' } });
  check(null, {
    'refused: no token 401': () => none.status === 401,
    'refused: unknown token 401': () => bad.status === 401,
    'refused: reader appending 403': () => reader.status === 403,
    'refused: oversized record 413': () => big.status === 413,
    'refused: unwritten position 404': () => ahead.status === 404,
    'refused: service still healthy': () => health.status === 200,
  });
}

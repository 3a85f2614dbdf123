// The Batch API as a user of the official npm `openai` client drives it:
// upload, create, poll, download; a malformed upload; a cancel mid-way.
// Prints one JSON object on stdout for the Go test to check.
//
// Environment: OPENAI_BASE_URL and OPENAI_API_KEY (read by the client
// itself), APIARY_NPM_PREFIX (the npm --prefix the package is installed
// under), BATCH_N (requests of the batch that completes), POLL_MS.
import { createRequire } from 'node:module';
import { File } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

// Node 18 (Debian 12's) has File only in node:buffer; the client's
// uploads look for it as a global.
globalThis.File ??= File;

// The package lives in a cache outside the tree, so it is loaded from
// there rather than resolved next to this file.
const prefix = process.env.APIARY_NPM_PREFIX;
const require = createRequire(join(prefix, 'node_modules'));
const { OpenAI, toFile, APIError } = require('openai');
const clientVersion = JSON.parse(readFileSync(join(prefix, 'node_modules', 'openai', 'package.json'))).version;

const client = new OpenAI({ maxRetries: 0, timeout: 20_000 });
const pollMS = Number(process.env.POLL_MS || 20);
const n = Number(process.env.BATCH_N || 20);
const ended = new Set(['completed', 'failed', 'cancelled', 'expired']);

const jsonl = (count, maxTokens) =>
  Array.from({ length: count }, (_, i) => JSON.stringify({
    custom_id: `req-${i}`, method: 'POST', url: '/v1/chat/completions',
    body: {
      model: 'tiny', messages: [{ role: 'user', content: `Tell me about ${i}` }],
      max_tokens: maxTokens, temperature: 0, ignore_eos: true,
    },
  })).join('\n') + '\n';

const upload = async (text) => client.files.create({ file: await toFile(Buffer.from(text), 'batch.jsonl'), purpose: 'batch' });

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// poll retrieves the batch until until(batch) holds.
async function poll(id, until) {
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (until(b)) return b;
    await sleep(pollMS);
  }
}

// lines downloads a file and parses its JSONL; null gives none.
async function lines(fileID) {
  if (!fileID) return [];
  const resp = await client.files.content(fileID);
  return (await resp.text()).split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));
}

const summary = (b) => ({ id: b.id, status: b.status, request_counts: b.request_counts, output_file_id: b.output_file_id,
  error_file_id: b.error_file_id, metadata: b.metadata });

const out = { client_version: clientVersion, node_version: process.version };

// Upload → create → poll → download.
const file = await upload(jsonl(n, 2));
out.file = { id: file.id, purpose: file.purpose, bytes: file.bytes, filename: file.filename };
let batch = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions',
  completion_window: '24h', metadata: { client: 'npm openai' } });
out.created = summary(batch);
batch = await poll(batch.id, (b) => ended.has(b.status));
out.completed = summary(batch);
out.output = await lines(batch.output_file_id);
out.errors = await lines(batch.error_file_id);

// A malformed line: refused at upload, naming its line.
try {
  await upload(jsonl(2, 2) + '{"custom_id":"req-2","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny"}}\n');
  out.malformed = { refused: false };
} catch (err) {
  if (!(err instanceof APIError)) throw err;
  out.malformed = { refused: true, status: err.status, message: err.error?.message ?? err.message };
}

// Cancel once the first request has completed.
const big = await upload(jsonl(100, 16));
let toCancel = await client.batches.create({ input_file_id: big.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
await poll(toCancel.id, (b) => b.request_counts.completed > 0 || ended.has(b.status));
out.cancel_answer = (await client.batches.cancel(toCancel.id)).status;
toCancel = await poll(toCancel.id, (b) => ended.has(b.status));
out.cancelled = summary(toCancel);
out.cancelled_output = await lines(toCancel.output_file_id);
out.cancelled_errors = await lines(toCancel.error_file_id);

// Auto-pagination over the batch list, one a page: both batches.
out.listed = [];
for await (const b of client.batches.list({ limit: 1 })) out.listed.push(b.id);

process.stdout.write(JSON.stringify(out) + '\n');

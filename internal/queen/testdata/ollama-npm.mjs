// What the `ollama` npm client does against the queen: list, show, ps,
// version, chat whole and streamed, generate, embed, the legacy
// embeddings, and the errors it must be able to read. Prints one JSON
// object on stdout; the Go test checks the values.
//
// Environment: BASE_URL, API_KEY, MODEL, OLLAMA_PREFIX (the npm --prefix
// the package is installed under).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const prefix = process.env.OLLAMA_PREFIX;
const require = createRequire(join(prefix, 'node_modules'));
const version = JSON.parse(readFileSync(join(prefix, 'node_modules', 'ollama', 'package.json'))).version;
const { Ollama } = require('ollama');

const model = process.env.MODEL;
const ollama = new Ollama({ host: process.env.BASE_URL, headers: { Authorization: `Bearer ${process.env.API_KEY}` } });
const opts = { num_predict: 8, temperature: 0 };
const messages = [{ role: 'user', content: 'Say hello to the bees.' }];
const out = { version };

out.list = await ollama.list();
out.show = await ollama.show({ model });
out.version_api = await ollama.version();
out.chat = await ollama.chat({ model, messages, options: opts });
const parts = [];
for await (const part of await ollama.chat({ model, messages, options: opts, stream: true })) parts.push(part);
out.streamed = { parts: parts.length, text: parts.map((p) => p.message.content).join(''), last: parts[parts.length - 1] };
out.ps = await ollama.ps();
out.generate = await ollama.generate({ model: `${model}:latest`, prompt: 'Say hello to the bees.', options: opts });
out.json_format = await ollama.chat({ model, messages, format: 'json', options: { num_predict: 40, temperature: 0 } });
// A plain JSON schema (no additionalProperties, a property not required),
// with tools, streamed: the answer must validate by the schema.
const schema = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 12 }, count: { type: 'integer', minimum: 0, maximum: 99 }, note: { type: 'string', maxLength: 4 } },
  required: ['name', 'count'],
};
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const schemaParts = [];
for await (const part of await ollama.chat({ model, messages, tools, format: schema, stream: true, options: { num_predict: 120, temperature: 0 } })) {
  schemaParts.push(part);
}
out.schema_format = { text: schemaParts.map((p) => p.message.content).join(''), calls: schemaParts.flatMap((p) => p.message.tool_calls ?? []),
  last: schemaParts[schemaParts.length - 1] };
// Unload, then load: each answered done at once with nothing generated.
const timed = async (fn) => {
  const t0 = performance.now();
  const r = await fn();
  return { ...r, ms: performance.now() - t0 };
};
out.unload = await timed(() => ollama.generate({ model, prompt: '', keep_alive: 0, stream: false }));
out.ps_after_unload = await ollama.ps();
out.load = await timed(() => ollama.generate({ model, prompt: '', stream: false }));
out.ps_after_load = await ollama.ps();
out.chat_load = await timed(() => ollama.chat({ model, messages: [], stream: false }));
out.embed = await ollama.embed({ model, input: ['a bee', 'a wasp'] });
out.embeddings = await ollama.embeddings({ model, prompt: 'a bee' });

const failure = async (what, fn) => {
  try {
    await fn();
    out[what] = { message: 'no error' };
  } catch (e) {
    out[what] = { message: e.message, status: e.status_code };
  }
};
await failure('missing_model', () => ollama.chat({ model: 'no-such-model', messages }));
await failure('bad_option', () => ollama.chat({ model, messages, options: { temprature: 0 } }));
await failure('pull', () => ollama.pull({ model, stream: false }));
await failure('no_token', () => new Ollama({ host: process.env.BASE_URL }).list());
console.log(JSON.stringify(out));

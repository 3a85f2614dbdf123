// The npm `openai` client's Responses API against the queen: text, a
// function tool round trip, json_schema, responses.stream (its events and
// final response), and what is refused. Prints one JSON object; the Go
// test checks it.
//
// Environment: BASE_URL (without /v1), API_KEY, MODEL, OPENAI_PREFIX.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const prefix = process.env.OPENAI_PREFIX;
const require = createRequire(join(prefix, 'node_modules'));
const version = JSON.parse(readFileSync(join(prefix, 'node_modules', 'openai', 'package.json'))).version;
const { OpenAI } = require('openai');
const model = process.env.MODEL;
const openai = new OpenAI({ baseURL: `${process.env.BASE_URL}/v1`, apiKey: process.env.API_KEY, maxRetries: 0, timeout: 60_000 });
const out = { version };

const text = await openai.responses.create({ model, input: 'Say hello to the bees.', max_output_tokens: 8, temperature: 0 });
out.text = { output_text: text.output_text, status: text.status, incomplete: text.incomplete_details, usage: text.usage, model: text.model, id: text.id };

const tools = [{ type: 'function', name: 'get_weather', description: 'The weather in a city', strict: true,
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'], additionalProperties: false } }];
const ask = [{ role: 'user', content: 'Weather in Oslo?' }];
const called = await openai.responses.create({ model, input: ask, tools, tool_choice: { type: 'function', name: 'get_weather' }, temperature: 0, max_output_tokens: 200 });
const call = called.output.find((o) => o.type === 'function_call');
out.call = { output: called.output, status: called.status };
const answered = await openai.responses.create({ model, tools, temperature: 0, max_output_tokens: 12,
  input: [...ask, call, { type: 'function_call_output', call_id: call.call_id, output: JSON.stringify({ celsius: 7, sky: 'rain' }) }] });
out.round_trip = { output_text: answered.output_text, status: answered.status, usage: answered.usage };

const beeSchema = { type: 'object', properties: { name: { type: 'string', maxLength: 6 }, n: { type: 'integer', minimum: 1, maximum: 9 } },
  required: ['name', 'n'], additionalProperties: false };
const schema = await openai.responses.create({ model, input: 'A bee as JSON.', temperature: 0, max_output_tokens: 200,
  text: { format: { type: 'json_schema', name: 'bee', schema: beeSchema, strict: true } } });
out.json_schema = { output_text: schema.output_text, status: schema.status };

const events = [];
const stream = openai.responses.stream({ model, input: 'Say hello to the bees.', max_output_tokens: 8, temperature: 0 });
stream.on('event', (e) => events.push(e.type));
const final = await stream.finalResponse();
out.streamed = { events, output_text: final.output_text, status: final.status, usage: final.usage };

const callEvents = [];
const cs = openai.responses.stream({ model, input: ask, tools, tool_choice: { type: 'function', name: 'get_weather' }, temperature: 0, max_output_tokens: 200 });
cs.on('event', (e) => callEvents.push(e.type));
const csFinal = await cs.finalResponse();
out.call_streamed = { events: callEvents, output: csFinal.output };

// A conversation continued from the kept response, read back, deleted.
const next = await openai.responses.create({ model, input: 'Again.', previous_response_id: text.id, max_output_tokens: 8, temperature: 0 });
out.next = { output_text: next.output_text, previous: next.previous_response_id, store: next.store };
const retrieved = await openai.responses.retrieve(text.id);
out.retrieved = { id: retrieved.id, output_text: retrieved.output_text };
await openai.responses.delete(text.id);
const failure = async (what, fn) => {
  try {
    await fn();
    out[what] = { message: 'no error' };
  } catch (e) {
    out[what] = { status: e.status, message: e.message, param: e.param };
  }
};
await failure('retrieve_deleted', () => openai.responses.retrieve(text.id));
await failure('previous_deleted', () => openai.responses.create({ model, input: 'x', previous_response_id: text.id }));
console.log(JSON.stringify(out));

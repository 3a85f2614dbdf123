// The npm `openai` client's Responses API against the queen with what
// this year's SDKs and agents send: fields the server does not know (as
// the SDK documents sending them: extra keys in the params, passed
// as-is), a response cut by max_output_tokens (whole and streamed: its
// items), and tool_choice "required" beside a json_schema text.format.
// Prints one JSON object; the Go test checks it.
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

// Fields newer than the server, and fields it ignores.
const extra = {
  conversation: null, prompt: null, prompt_cache_retention: '24h', prompt_cache_key: 'bees', safety_identifier: 'user-1',
  service_tier: 'auto', truncation: 'auto', include: ['message.output_text.logprobs'], text: { verbosity: 'low' },
  context_management: [{ type: 'compaction', compact_threshold: 100000 }], a_field_from_next_year: { nested: [1, 2] },
};
const items = (r) => r.output.map((o) => ({ type: o.type, status: o.status }));

const whole = await openai.responses.create({ model, input: 'Say hello to the bees.', max_output_tokens: 8, temperature: 0, ...extra });
out.whole = { status: whole.status, incomplete: whole.incomplete_details, items: items(whole), output_text: whole.output_text };

const done = [];
const stream = openai.responses.stream({ model, input: 'Say hello to the bees.', max_output_tokens: 8, temperature: 0, ...extra });
stream.on('event', (e) => {
  if (e.type === 'response.output_item.done') done.push({ type: e.item.type, status: e.item.status });
});
const final = await stream.finalResponse();
out.streamed = { status: final.status, items: items(final), done, output_text: final.output_text };

// What @openai/agents sends for an agent with tools, tool_choice
// "required" and an output type: the forced call follows the tool's
// parameters. One call (parallel_tool_calls false): with random weights,
// a model free to add calls adds them until max_output_tokens.
const tools = [{ type: 'function', name: 'get_weather', description: 'The weather in a city', strict: true,
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'], additionalProperties: false } }];
const format = { type: 'json_schema', name: 'bee', strict: true,
  schema: { type: 'object', properties: { name: { type: 'string', maxLength: 6 } }, required: ['name'], additionalProperties: false } };
const forced = await openai.responses.create({ model, input: 'Weather in Oslo?', tools, tool_choice: 'required', parallel_tool_calls: false, text: { format },
  temperature: 0, max_output_tokens: 200 });
out.forced = { status: forced.status, output: forced.output, text: forced.text };
console.log(JSON.stringify(out));

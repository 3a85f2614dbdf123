// What the official npm clients send, against one base URL (the queen or a
// worker straight): structured output, a forced tool call (whole and
// streamed through the client's own stream helper), a full tool round
// trip, embeddings (the client asks for base64 and decodes), logprobs, n,
// penalties, and Anthropic's /v1/messages through @anthropic-ai/sdk,
// whole and streamed. Prints one JSON object on stdout for the Go test to
// check; the checks of values live in the Go test.
//
// Environment: BASE_URL (without /v1), API_KEY, MODEL, OPENAI_PREFIX and
// ANTHROPIC_PREFIX (the npm --prefix each package is installed under).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const load = (prefix, pkg) => {
  const require = createRequire(join(prefix, 'node_modules'));
  const version = JSON.parse(readFileSync(join(prefix, 'node_modules', pkg, 'package.json'))).version;
  return [require(pkg), version];
};
const [openaiPkg, openaiVersion] = load(process.env.OPENAI_PREFIX, 'openai');
const [anthropicPkg, anthropicVersion] = load(process.env.ANTHROPIC_PREFIX, '@anthropic-ai/sdk');

const base = process.env.BASE_URL;
const model = process.env.MODEL;
const openai = new openaiPkg.OpenAI({ baseURL: `${base}/v1`, apiKey: process.env.API_KEY, maxRetries: 0, timeout: 60_000 });
const anthropic = new anthropicPkg.Anthropic({ baseURL: base, apiKey: process.env.API_KEY, maxRetries: 0, timeout: 60_000 });

const out = { openai_version: openaiVersion, anthropic_version: anthropicVersion, node_version: process.version };

// Structured output.
const beeSchema = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 6 }, n: { type: 'integer', minimum: 1, maximum: 9 }, kind: { enum: ['bee', 'wasp'] } },
  required: ['name', 'n', 'kind'], additionalProperties: false,
};
const schemaAnswer = await openai.chat.completions.create({
  model, messages: [{ role: 'user', content: 'A bee as JSON.' }], max_completion_tokens: 200, temperature: 0,
  response_format: { type: 'json_schema', json_schema: { name: 'bee', strict: true, schema: beeSchema } },
});
out.json_schema = { content: schemaAnswer.choices[0].message.content, finish: schemaAnswer.choices[0].finish_reason };

// A forced tool call, whole and streamed, one call (parallel_tool_calls
// false: the grammar ends after it; with several allowed, the random
// test model goes on writing calls until max_completion_tokens cuts one,
// finish_reason length). Greedy: see the Go test.
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'], additionalProperties: false },
  },
}];
const ask = [{ role: 'user', content: 'Weather in Oslo?' }];
const forced = { model, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false, temperature: 0, max_completion_tokens: 200 };
const called = await openai.chat.completions.create({ ...forced, messages: ask });
out.tool_call = { message: called.choices[0].message, finish: called.choices[0].finish_reason };

const stream = openai.chat.completions.stream({ ...forced, messages: ask });
let deltas = 0;
stream.on('chunk', (chunk) => { if (chunk.choices[0]?.delta?.tool_calls) deltas++; });
const streamed = await stream.finalChatCompletion();
out.tool_call_streamed = { message: streamed.choices[0].message, finish: streamed.choices[0].finish_reason, tool_call_deltas: deltas };

// The round trip: the call, the tool's result, the answer.
const call = called.choices[0].message.tool_calls[0];
const answered = await openai.chat.completions.create({
  model, tools, temperature: 0, max_completion_tokens: 12,
  messages: [...ask, { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ celsius: 7, sky: 'rain' }) }],
});
out.round_trip = { content: answered.choices[0].message.content, finish: answered.choices[0].finish_reason, usage: answered.usage };

// Embeddings: the client asks for base64 unless told otherwise.
const embed = async (input, encoding_format) => (await openai.embeddings.create({ model, input, encoding_format })).data.map((d) => Array.from(d.embedding));
out.embeddings = {
  base64: await embed(['The bees', 'A queen'], undefined),
  again: await embed(['The bees'], undefined),
  float: await embed(['The bees'], 'float'),
};

// Logprobs and several choices.
const lp = await openai.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 5, temperature: 1, seed: 3, n: 2,
  logprobs: true, top_logprobs: 3, ignore_eos: true,
});
out.logprobs = lp.choices.map((c) => ({ index: c.index, tokens: c.logprobs.content.map((t) => ({ logprob: t.logprob, top: t.top_logprobs.length })) }));
out.logprobs_usage = lp.usage;

// Penalties change greedy output.
const greedy = async (extra) => (await openai.completions.create({
  model, prompt: 'The bees', max_tokens: 48, temperature: 0, ignore_eos: true, ...extra,
})).choices[0].text;
out.penalties = { plain: await greedy({}), frequency: await greedy({ frequency_penalty: 2 }), presence: await greedy({ presence_penalty: 2 }) };

// Anthropic's Messages API.
const msg = { model, max_tokens: 6, temperature: 0, system: 'Be brief.', messages: [{ role: 'user', content: 'Hi' }] };
const whole = await anthropic.messages.create(msg);
out.messages = { id: whole.id, type: whole.type, role: whole.role, stop_reason: whole.stop_reason, content: whole.content, usage: whole.usage };
const ms = anthropic.messages.stream(msg);
const events = [];
ms.on('streamEvent', (ev) => events.push(ev.type));
const final = await ms.finalMessage();
out.messages_streamed = { events, content: final.content, stop_reason: final.stop_reason, usage: final.usage };
// Anthropic tool use: a forced call, whole and streamed, then the round
// trip with its result.
const atools = [{ name: 'get_weather', description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'], additionalProperties: false } }];
const aforced = { model, max_tokens: 200, temperature: 0, tools: atools, tool_choice: { type: 'tool', name: 'get_weather' }, messages: [{ role: 'user', content: 'Weather in Oslo?' }] };
const aCalled = await anthropic.messages.create(aforced);
const aStream = anthropic.messages.stream(aforced);
const aEvents = [];
aStream.on('streamEvent', (ev) => aEvents.push(ev.type + (ev.delta?.type ? ':' + ev.delta.type : '') + (ev.content_block?.type ? ':' + ev.content_block.type : '')));
const aStreamed = await aStream.finalMessage();
const use = aCalled.content.find((b) => b.type === 'tool_use');
const aAnswered = await anthropic.messages.create({ model, max_tokens: 12, temperature: 0, tools: atools,
  messages: [...aforced.messages, { role: 'assistant', content: aCalled.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: JSON.stringify({ celsius: 7 }) }] }] });
out.messages_tools = { called: { content: aCalled.content, stop_reason: aCalled.stop_reason },
  streamed: { content: aStreamed.content, stop_reason: aStreamed.stop_reason, events: aEvents },
  answered: { content: aAnswered.content, stop_reason: aAnswered.stop_reason } };
const { max_tokens: _m, temperature: _t, ...counted } = msg;
out.count_tokens = await anthropic.messages.countTokens(counted);

process.stdout.write(JSON.stringify(out));

// @openai/agents on the Responses path against the queen: an agent with
// a function tool, tool_choice "required" and an output type (a zod
// schema) runs to its final output, not streamed and streamed. The
// model's weights are random: every step is valid because the grammar
// makes it so (the forced call by the tool's parameters, the answer
// after the tool's output by the output type). Prints one JSON object;
// the Go test checks it.
//
// Environment: BASE_URL (without /v1), API_KEY, MODEL, OPENAI_PREFIX,
// AGENTS_PREFIX, ZOD_PREFIX (each an npm install prefix).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const load = (prefix, pkg) => ({
  mod: createRequire(join(prefix, 'node_modules'))(pkg),
  version: JSON.parse(readFileSync(join(prefix, 'node_modules', pkg, 'package.json'))).version,
});
const openaiPkg = load(process.env.OPENAI_PREFIX, 'openai');
const agentsPkg = load(process.env.AGENTS_PREFIX, '@openai/agents');
const zodPkg = load(process.env.ZOD_PREFIX, 'zod');
const { OpenAI } = openaiPkg.mod;
const { Agent, run, tool, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } = agentsPkg.mod;
const { z } = zodPkg.mod;

setTracingDisabled(true);
setDefaultOpenAIClient(new OpenAI({ baseURL: `${process.env.BASE_URL}/v1`, apiKey: process.env.API_KEY, maxRetries: 0, timeout: 60_000 }));
setOpenAIAPI('responses');

const calls = [];
const getWeather = tool({
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: z.object({ city: z.string().max(10) }),
  execute: async ({ city }) => {
    calls.push(city);
    return JSON.stringify({ city, celsius: 7, sky: 'rain' });
  },
});
const Bee = z.object({ name: z.string().max(6), n: z.number().int().min(1).max(9) });
const agent = new Agent({
  name: 'Forecaster',
  instructions: 'Look up the weather, then answer with a bee.',
  model: process.env.MODEL,
  tools: [getWeather],
  outputType: Bee,
  // One call a turn: with random weights, a model free to add calls
  // adds them until maxTokens, and the SDK ends an incomplete turn.
  modelSettings: { toolChoice: 'required', parallelToolCalls: false, temperature: 0, maxTokens: 200 },
});

const summary = (result) => ({
  final_output: result.finalOutput,
  // The output type validates the final output (the SDK parsed it with
  // the schema; parsing again says so here).
  valid: Bee.safeParse(result.finalOutput).success,
  items: result.newItems.map((i) => i.type),
  responses: result.rawResponses.length,
});
const out = { versions: { openai: openaiPkg.version, agents: agentsPkg.version, zod: zodPkg.version } };
out.run = summary(await run(agent, 'What is the weather in Oslo?', { maxTurns: 4 }));
out.run.calls = calls.splice(0);
const streamed = await run(agent, 'What is the weather in Oslo?', { maxTurns: 4, stream: true });
for await (const _ of streamed) {
  // Drain the events; the result settles when the stream ends.
}
await streamed.completed;
out.streamed = summary(streamed);
out.streamed.calls = calls.splice(0);
console.log(JSON.stringify(out));

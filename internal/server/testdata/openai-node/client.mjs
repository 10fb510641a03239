// Drives sluiced's OpenAI-compatible front with the official OpenAI client
// for Node (TestOpenAINodeClient). Each line printed is one request's
// result as JSON: tenant, kind (whole or stream), status, the text, the
// finish reason, the usage the engine reported, and for a refusal its
// Retry-After. The base URL is SLUICE_OPENAI_URL; the API keys
// SLUICE_KEY_OK (a tenant with room) and SLUICE_KEY_OVER (a tenant that
// may send one request).
import OpenAI from "openai";

const baseURL = process.env.SLUICE_OPENAI_URL;
const model = process.env.SLUICE_MODEL;
const messages = [{ role: "user", content: "Write a few words about NVLink domains." }];

function client(apiKey) {
  // No retries: a 429 is what the test looks for, not something to wait out.
  return new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
}

async function whole(tenant, apiKey) {
  const r = await client(apiKey).chat.completions.create({ model, messages, max_tokens: 48, seed: 7 });
  return { tenant, kind: "whole", status: 200, text: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };
}

async function stream(tenant, apiKey) {
  const s = await client(apiKey).chat.completions.create({
    model, messages, max_tokens: 48, seed: 7, stream: true, stream_options: { include_usage: true },
  });
  let text = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of s) {
    chunks++;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      finish = c.finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  return { tenant, kind: "stream", status: 200, text, finish, usage, chunks };
}

async function run(tenant, kind, apiKey) {
  try {
    return await (kind === "whole" ? whole : stream)(tenant, apiKey);
  } catch (e) {
    if (e instanceof OpenAI.APIError) {
      return { tenant, kind, status: e.status, retryAfter: e.headers?.get("retry-after") ?? null, type: e.type ?? null, message: e.message };
    }
    throw e;
  }
}

const ok = process.env.SLUICE_KEY_OK;
const over = process.env.SLUICE_KEY_OVER;
for (const [tenant, kind, key] of [
  ["ok", "whole", ok],
  ["ok", "stream", ok],
  ["over", "whole", over],
  ["over", "stream", over],
]) {
  console.log(JSON.stringify(await run(tenant, kind, key)));
}

'use strict';
/**
 * trtserve's queue door from Node.js: one request appended to a model's Redis stream, its result
 * read from a reply stream. Nothing here is Python's: the message is plain Redis stream fields
 * and the body is KServe v2 JSON (docs/guide/queue.md has every field).
 *
 *   const { createClient } = require('redis');
 *   const { enqueue, waitForResult } = require('./lib/queue');
 *   const redis = await createClient({ url: 'redis://127.0.0.1:6379/0' }).connect();
 *   const { id, replyTo } = await enqueue(redis, 'minilm', { inputs: [{ name: 'TEXT', datatype: 'BYTES', shape: [1, 1], data: ['A dog runs.'] }] });
 *   const result = await waitForResult(redis, replyTo, id);   // { id, status, message, response, timings }
 */
const { randomUUID } = require('node:crypto');

const PREFIX = 'trtserve';

/**
 * Append one request to `${PREFIX}:requests:<model>` (XADD) and return its id and reply stream.
 *
 * @param redis a connected node-redis client
 * @param model the model's name (its stream)
 * @param body the request as KServe v2 JSON (an object: `{ inputs: [...], outputs?, parameters? }`)
 * @param options `id` (default a new UUID; the same id twice is computed once), `timeoutUs`
 *   (microseconds counted from the time Redis takes the message, so time waiting in the queue
 *   counts), `priority` (1 is the most urgent), `replyTo` (default a new stream of this call's),
 *   `resultTtlS` (seconds the result key lives)
 */
async function enqueue(redis, model, body, options = {}) {
  const id = options.id || randomUUID();
  const replyTo = options.replyTo || `${PREFIX}:replies:${randomUUID()}`;
  const fields = { format: 'json', body: JSON.stringify(body), id, reply_to: replyTo };
  if (options.timeoutUs) fields.timeout_us = String(options.timeoutUs);
  if (options.priority) fields.priority = String(options.priority);
  if (options.resultTtlS) fields.result_ttl_s = String(options.resultTtlS);
  await redis.xAdd(`${PREFIX}:requests:${model}`, '*', fields);
  return { id, replyTo };
}

/** A result's fields (from the reply stream or the result hash) as an object: `status` is 'OK' or
 * the gRPC status name; `response` the KServe v2 JSON response (OK only); `timings` in ms. */
function parseResult(fields) {
  const timings = {};
  for (const name of ['enqueued_ms', 'queue_ms', 'total_ms']) {
    if (fields[name] !== undefined) timings[name] = Number(fields[name]);
  }
  return {
    id: fields.id,
    status: fields.status,
    message: fields.message || '',
    response: fields.status === 'OK' && fields.body ? JSON.parse(fields.body) : null,
    timings,
  };
}

/**
 * Wait (XREAD BLOCK) on `replyTo` for the result of `id`, at most `timeoutMs`; delete the reply
 * stream afterwards. Throws an Error when no result came in time.
 */
async function waitForResult(redis, replyTo, id, timeoutMs = 60_000) {
  const end = Date.now() + timeoutMs;
  let last = '0-0';
  try {
    while (Date.now() < end) {
      const reply = await redis.xRead({ key: replyTo, id: last }, { BLOCK: Math.max(1, Math.min(1000, end - Date.now())), COUNT: 100 });
      for (const stream of reply || []) {
        for (const entry of stream.messages) {
          last = entry.id;
          if (entry.message.id === id) return parseResult(entry.message);
        }
      }
    }
  } finally {
    await redis.del(replyTo);
  }
  throw new Error(`no result for '${id}' on ${replyTo} within ${timeoutMs} ms (is a trtserve reading this Redis, with --redis-url?)`);
}

module.exports = { PREFIX, enqueue, parseResult, waitForResult };

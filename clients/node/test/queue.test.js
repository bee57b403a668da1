'use strict';
// node --test: the queue door from Node.js (lib/queue.js, node-redis) against a live trtserve that
// reads TRTSERVE_REDIS_URL (clients/run_all.sh starts redis-server and passes --redis-url);
// skipped without it.
const test = require('node:test');
const assert = require('node:assert/strict');
const { createClient } = require('redis');
const { enqueue, waitForResult } = require('../lib/queue');

const URL = process.env.TRTSERVE_REDIS_URL;
const skip = URL ? false : 'TRTSERVE_REDIS_URL is not set (clients/run_all.sh sets it when redis-server is installed)';
let redis;

test.before(async () => {
  if (URL) redis = await createClient({ url: URL }).connect();
});

test.after(async () => {
  if (redis) await redis.close();
});

function sentence(text) {
  return { inputs: [{ name: 'TEXT', datatype: 'BYTES', shape: [1, 1], data: [text] }] };
}

test('one sentence through the queue door: a unit-norm 384-d embedding and the timings', { skip }, async () => {
  const { id, replyTo } = await enqueue(redis, 'minilm', sentence('A man plays a guitar on a stage.'), { timeoutUs: 60_000_000 });
  const result = await waitForResult(redis, replyTo, id);
  assert.equal(result.status, 'OK', result.message);
  assert.equal(result.id, id);
  const embedding = result.response.outputs.find((o) => o.name === 'EMBEDDING');
  assert.deepEqual(embedding.shape, [1, 384]);
  const norm = Math.sqrt(embedding.data.reduce((s, v) => s + v * v, 0));
  assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
  assert.ok(result.timings.total_ms >= result.timings.queue_ms, JSON.stringify(result.timings));
  // The result also stays in its key, for a reader that was not waiting.
  const stored = await redis.hGetAll(`trtserve:result:minilm:${id}`);
  assert.equal(stored.status, 'OK');
});

test('a request naming an input the model lacks is answered INVALID_ARGUMENT with the sentence', { skip }, async () => {
  const body = { inputs: [{ name: 'NOT_AN_INPUT', datatype: 'BYTES', shape: [1, 1], data: ['x'] }] };
  const { id, replyTo } = await enqueue(redis, 'minilm', body);
  const result = await waitForResult(redis, replyTo, id);
  assert.equal(result.status, 'INVALID_ARGUMENT');
  assert.match(result.message, /NOT_AN_INPUT/);
  assert.equal(result.response, null);
});

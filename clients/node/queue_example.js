#!/usr/bin/env node
'use strict';
// Usage: node queue_example.js [redis-url]   (default redis://127.0.0.1:6379/0)
// Needs a trtserve reading that Redis: `trtserve serve --model-repository engines --redis-url redis://127.0.0.1:6379/0`.
// One sentence goes to minilm through the queue door (KServe v2 JSON in a Redis stream entry);
// the result comes back on a reply stream.
const { createClient } = require('redis');
const { enqueue, waitForResult } = require('./lib/queue');

async function main(url) {
  const redis = await createClient({ url }).connect();
  try {
    const body = { inputs: [{ name: 'TEXT', datatype: 'BYTES', shape: [1, 1], data: ['A man plays a guitar on a stage.'] }] };
    const { id, replyTo } = await enqueue(redis, 'minilm', body, { timeoutUs: 30_000_000 });
    const result = await waitForResult(redis, replyTo, id);
    if (result.status !== 'OK') throw new Error(`${id}: ${result.status}: ${result.message}`);
    const embedding = result.response.outputs.find((o) => o.name === 'EMBEDDING');
    console.log(`${id}: ${result.status}, EMBEDDING [${embedding.shape}] starts`, embedding.data.slice(0, 4).map((v) => v.toFixed(4)).join(' '),
      `; waited ${result.timings.queue_ms} ms in Redis, answered ${result.timings.total_ms} ms after the XADD`);
  } finally {
    await redis.close();
  }
}

main(process.argv[2] || 'redis://127.0.0.1:6379/0').catch((err) => {
  console.error(err.message || err);
  process.exit(1);
});

'use strict';
// node --test: the Node.js client against a live trtserve (see lib/server.js for which one).
const test = require('node:test');
const assert = require('node:assert/strict');
const { Client, grpc } = require('../lib/trtserve');
const { startServer } = require('../lib/server');

let server;
let client;

test.before(async () => {
  server = await startServer();
  client = new Client(server.url);
  assert.equal(await client.isReady('tiny'), true);
});

test.after(async () => {
  client.close();
  await server.stop();
});

function fp32(shape, fill) {
  const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
  data.forEach((_, i) => (data[i] = fill(i)));
  return { datatype: 'FP32', shape, data };
}

test('unary infer on identity_fp32 returns the same values', async () => {
  const input = fp32([3, 5], (i) => i * 0.5 - 3);
  const out = await client.infer('identity_fp32', { INPUT0: input }, { timeout: 10 });
  assert.equal(out.OUTPUT0.datatype, 'FP32');
  assert.deepEqual(out.OUTPUT0.shape, [3, 5]);
  assert.deepEqual(Array.from(out.OUTPUT0.data), Array.from(input.data));
});

test('unary infer on tiny: [2,64] -> [2,16] FP32, each row as when sent alone', async () => {
  const input = fp32([2, 64], (i) => Math.sin(i));
  const out = await client.infer('tiny', { INPUT: input }, { outputs: ['OUTPUT'], timeout: 10 });
  assert.equal(out.OUTPUT.datatype, 'FP32');
  assert.deepEqual(out.OUTPUT.shape, [2, 16]);
  assert.ok(out.OUTPUT.data.every(Number.isFinite));
  for (const row of [0, 1]) {
    const alone = await client.infer('tiny', { INPUT: { datatype: 'FP32', shape: [1, 64], data: input.data.slice(row * 64, row * 64 + 64) } });
    const batched = out.OUTPUT.data.slice(row * 16, row * 16 + 16);
    alone.OUTPUT.data.forEach((v, i) => assert.ok(Math.abs(v - batched[i]) <= 1e-5, `row ${row} col ${i}: ${v} vs ${batched[i]}`));
  }
  assert.notDeepEqual(Array.from(out.OUTPUT.data.slice(0, 16)), Array.from(out.OUTPUT.data.slice(16)));
});

test('BYTES round trip on echo_bytes', async () => {
  const out = await client.infer('echo_bytes', { INPUT0: { datatype: 'BYTES', shape: [1, 3], data: ['hello', 'wörld', ''] } });
  assert.deepEqual(out.OUTPUT0.data.map((b) => b.toString('utf8')), ['hello', 'wörld', '']);
});

test('a bad input is INVALID_ARGUMENT naming the tensor', async () => {
  const bad = { INPUT: { datatype: 'FP32', shape: [64], data: new Float32Array(64) } }; // no batch dim
  await assert.rejects(client.infer('tiny', bad), (err) => err.code === grpc.status.INVALID_ARGUMENT && /INPUT/.test(err.details));
});

test('a 100-message stream answers every id exactly once with its own values', async () => {
  const sent = new Map();
  const items = [];
  for (let i = 0; i < 100; i++) {
    const input = fp32([1, 1 + (i % 7)], (j) => i * 100 + j);
    sent.set(`req-${i}`, input);
    items.push({ id: `req-${i}`, inputs: { INPUT0: input } });
  }
  const seen = new Map();
  for await (const result of client.streamInfer('identity_fp32', items, { maxInflight: 32, timeout: 60 })) {
    assert.equal(result.error, undefined, result.error && result.error.message);
    seen.set(result.id, (seen.get(result.id) || 0) + 1);
    const input = sent.get(result.id);
    assert.ok(input, `unexpected id ${result.id}`);
    assert.deepEqual(result.outputs.OUTPUT0.shape, input.shape);
    assert.deepEqual(Array.from(result.outputs.OUTPUT0.data), Array.from(input.data));
  }
  assert.equal(seen.size, 100);
  assert.ok([...seen.values()].every((count) => count === 1));
});

test('a 1 µs timeout parameter is answered DEADLINE_EXCEEDED (unary)', async () => {
  const input = { INPUT: fp32([1, 64], () => 1) };
  await assert.rejects(client.infer('tiny', input, { timeoutUs: 1, timeout: 10 }), (err) => err.code === grpc.status.DEADLINE_EXCEEDED);
});

test('in a stream, only the message with a 1 µs timeout fails, with DEADLINE_EXCEEDED', async () => {
  const input = { INPUT: fp32([1, 64], () => 1) };
  const items = [
    { id: 'ok-1', inputs: input },
    { id: 'late', inputs: input, timeoutUs: 1 },
    { id: 'ok-2', inputs: input },
  ];
  const results = {};
  for await (const r of client.streamInfer('tiny', items, { timeout: 30 })) results[r.id] = r;
  assert.deepEqual(Object.keys(results).sort(), ['late', 'ok-1', 'ok-2']);
  assert.equal(results.late.error.code, 'DEADLINE_EXCEEDED');
  assert.ok(results['ok-1'].outputs && results['ok-2'].outputs);
});

test('an expired gRPC deadline gives DEADLINE_EXCEEDED', async () => {
  const input = { INPUT: fp32([1, 64], () => 1) };
  await assert.rejects(client.infer('tiny', input, { timeout: 1e-6 }), (err) => err.code === grpc.status.DEADLINE_EXCEEDED);
});

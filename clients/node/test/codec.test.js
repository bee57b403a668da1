'use strict';
// The tensor codec alone (no server): raw little-endian bytes and BYTES framing.
const test = require('node:test');
const assert = require('node:assert/strict');
const { encodeTensor, decodeTensor, buildRequest } = require('../lib/trtserve');

test('FP32 is little-endian IEEE 754', () => {
  const raw = encodeTensor('x', { datatype: 'FP32', shape: [1, 3], data: [1, 2, 3] });
  assert.equal(raw.toString('base64'), 'AACAPwAAAEAAAEBA');
  assert.deepEqual(Array.from(decodeTensor('FP32', [1, 3], raw)), [1, 2, 3]);
});

test('INT64 from numbers or bigints, BOOL from booleans', () => {
  const raw = encodeTensor('x', { datatype: 'INT64', shape: [2], data: [-1, 2n ** 40n] });
  assert.equal(raw.length, 16);
  assert.deepEqual(Array.from(decodeTensor('INT64', [2], raw)), [-1n, 2n ** 40n]);
  const flags = encodeTensor('b', { datatype: 'BOOL', shape: [3], data: [true, false, true] });
  assert.deepEqual(Array.from(flags), [1, 0, 1]);
});

test('decoding a slice at an odd offset copies it into an aligned array', () => {
  const raw = Buffer.concat([Buffer.from([0xff]), encodeTensor('x', { datatype: 'FP64', shape: [2], data: [0.5, -2] })]).subarray(1);
  assert.deepEqual(Array.from(decodeTensor('FP64', [2], raw)), [0.5, -2]);
});

test('BYTES elements are a 4-byte little-endian length and the data', () => {
  const raw = encodeTensor('t', { datatype: 'BYTES', shape: [2], data: ['hé', Buffer.from([0, 1])] });
  assert.deepEqual(Array.from(raw), [3, 0, 0, 0, 0x68, 0xc3, 0xa9, 2, 0, 0, 0, 0, 1]);
  assert.deepEqual(decodeTensor('BYTES', [2], raw).map((b) => Array.from(b)), [[0x68, 0xc3, 0xa9], [0, 1]]);
});

test('the element count must match the shape; parameters go into the request', () => {
  assert.throws(() => encodeTensor('x', { datatype: 'FP32', shape: [2, 2], data: [1, 2, 3] }), /needs 4 elements, got 3/);
  const request = buildRequest('m', { x: { datatype: 'UINT8', shape: [1], data: [7] } }, { id: 'a', timeoutUs: 5, priority: 1, outputs: ['y'] });
  assert.deepEqual(request.parameters, { timeout: { int64_param: 5 }, priority: { uint64_param: 1 } });
  assert.deepEqual(request.outputs, [{ name: 'y' }]);
  assert.equal(request.id, 'a');
});

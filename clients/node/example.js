#!/usr/bin/env node
'use strict';
// Usage: node example.js [host:port]   (default 127.0.0.1:8001; start one with `make serve`)
const { Client } = require('./lib/trtserve');

async function main(url) {
  const client = new Client(url);
  try {
    // Unary: two rows of 64 floats through `tiny`.
    const x = new Float32Array(2 * 64).map((_, i) => Math.sin(i));
    const out = await client.infer('tiny', { INPUT: { datatype: 'FP32', shape: [2, 64], data: x } }, { timeout: 5 });
    console.log(`tiny: OUTPUT ${out.OUTPUT.datatype} [${out.OUTPUT.shape}], row 0 starts`, Array.from(out.OUTPUT.data.slice(0, 4), (v) => v.toFixed(4)).join(' '));

    // Bulk: 10 sentences over one stream, answered in completion order with their ids.
    const texts = Array.from({ length: 10 }, (_, i) => `Sentence number ${i} about a guitar.`);
    const items = texts.map((text, i) => ({ id: `s${i}`, inputs: { TEXT: { datatype: 'BYTES', shape: [1, 1], data: [text] } } }));
    for await (const r of client.streamInfer('minilm', items, { timeout: 60 })) {
      if (r.error) console.log(r.id, 'failed:', r.error.code, r.error.message);
      else console.log(r.id, `EMBEDDING [${r.outputs.EMBEDDING.shape}]`, r.outputs.EMBEDDING.data[0].toFixed(4));
    }
  } finally {
    client.close();
  }
}

main(process.argv[2] || '127.0.0.1:8001').catch((err) => {
  console.error(err.message || err);
  process.exit(1);
});

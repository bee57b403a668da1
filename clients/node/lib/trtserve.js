'use strict';
/**
 * Node.js client for trtserve (or any KServe v2 / Triton gRPC server).
 *
 * The service definition is loaded from the repository's protos/ at run time with
 * @grpc/proto-loader: there is no generated code to keep in sync with the contract.
 *
 *   const { Client } = require('./lib/trtserve');
 *   const client = new Client('127.0.0.1:8001');
 *   const out = await client.infer('tiny', { INPUT: { datatype: 'FP32', shape: [2, 64], data: new Float32Array(128) } });
 *   out.OUTPUT.data;   // Float32Array(32), out.OUTPUT.shape == [2, 16]
 *   for await (const r of client.streamInfer('tiny', items)) { r.id; r.outputs || r.error; }
 *
 * Tensors travel as raw little-endian bytes (raw_input_contents / raw_output_contents);
 * BYTES elements are a 4-byte little-endian length followed by the data.
 */
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTOS = process.env.TRTSERVE_PROTOS || path.resolve(__dirname, '..', '..', '..', 'protos');
const MAX_MESSAGE_BYTES = 2 ** 31 - 1;

/** KServe datatype -> [TypedArray class, element bytes, DataView getter/setter suffix]. */
const NUMERIC = {
  BOOL: [Uint8Array, 1, 'Uint8'],
  UINT8: [Uint8Array, 1, 'Uint8'],
  UINT16: [Uint16Array, 2, 'Uint16'],
  UINT32: [Uint32Array, 4, 'Uint32'],
  UINT64: [BigUint64Array, 8, 'BigUint64'],
  INT8: [Int8Array, 1, 'Int8'],
  INT16: [Int16Array, 2, 'Int16'],
  INT32: [Int32Array, 4, 'Int32'],
  INT64: [BigInt64Array, 8, 'BigInt64'],
  FP16: [Uint16Array, 2, 'Uint16'], // raw IEEE half bits
  BF16: [Uint16Array, 2, 'Uint16'], // raw bfloat16 bits
  FP32: [Float32Array, 4, 'Float32'],
  FP64: [Float64Array, 8, 'Float64'],
};
const LITTLE_ENDIAN_HOST = os.endianness() === 'LE';

let cachedService = null;

/** The inference.GRPCInferenceService client constructor, loaded from protos/ once. */
function loadService(protosDir = PROTOS) {
  if (cachedService && protosDir === PROTOS) return cachedService;
  const definition = protoLoader.loadSync('inference/grpc_service.proto', {
    includeDirs: [protosDir],
    keepCase: true, // field names exactly as in the .proto (raw_input_contents, ...)
    longs: Number, // int64 shapes and parameters as JS numbers
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const service = grpc.loadPackageDefinition(definition).inference.GRPCInferenceService;
  if (protosDir === PROTOS) cachedService = service;
  return service;
}

function product(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

/** One tensor ({datatype, shape, data}) -> its raw little-endian bytes. */
function encodeTensor(name, { datatype, shape, data }) {
  if (datatype === 'BYTES') {
    const items = Array.from(data, (v) => (Buffer.isBuffer(v) ? v : Buffer.from(String(v), 'utf8')));
    if (items.length !== product(shape)) {
      throw new RangeError(`input '${name}': shape [${shape}] needs ${product(shape)} elements, got ${items.length}`);
    }
    const parts = [];
    for (const item of items) {
      const len = Buffer.alloc(4);
      len.writeUInt32LE(item.length);
      parts.push(len, item);
    }
    return Buffer.concat(parts);
  }
  const spec = NUMERIC[datatype];
  if (!spec) throw new TypeError(`input '${name}': unknown datatype ${datatype}`);
  const [Typed, size, accessor] = spec;
  const big = Typed === BigInt64Array || Typed === BigUint64Array;
  const values = data instanceof Typed ? data : Typed.from(data, big ? (v) => BigInt(v) : (v) => Number(v));
  if (values.length !== product(shape)) {
    throw new RangeError(`input '${name}': shape [${shape}] needs ${product(shape)} elements, got ${values.length}`);
  }
  if (LITTLE_ENDIAN_HOST) return Buffer.from(values.buffer, values.byteOffset, values.byteLength);
  const out = Buffer.alloc(values.length * size);
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
  values.forEach((v, i) => view[`set${accessor}`](i * size, v, true));
  return out;
}

/** Raw little-endian bytes -> a typed array (an array of Buffers for BYTES). */
function decodeTensor(datatype, shape, raw) {
  if (datatype === 'BYTES') {
    const items = [];
    for (let at = 0; at < raw.length; ) {
      const len = raw.readUInt32LE(at);
      items.push(raw.subarray(at + 4, at + 4 + len));
      at += 4 + len;
    }
    return items;
  }
  const [Typed, size, accessor] = NUMERIC[datatype];
  const count = raw.length / size;
  // Copy into a fresh (aligned) buffer: gRPC hands us slices at arbitrary offsets.
  if (LITTLE_ENDIAN_HOST) return new Typed(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length));
  const out = new Typed(count);
  const view = new DataView(raw.buffer, raw.byteOffset, raw.length);
  for (let i = 0; i < count; i++) out[i] = view[`get${accessor}`](i * size, true);
  return out;
}

/**
 * A ModelInferRequest message.
 * @param {string} model
 * @param {Object<string, {datatype: string, shape: number[], data: ArrayLike}>} inputs
 * @param {{id?: string, outputs?: string[], timeoutUs?: number, priority?: number}} [options]
 */
function buildRequest(model, inputs, { id = '', outputs = [], timeoutUs, priority } = {}) {
  const request = {
    model_name: model,
    id,
    inputs: [],
    outputs: outputs.map((name) => ({ name })),
    raw_input_contents: [],
    parameters: {},
  };
  for (const [name, tensor] of Object.entries(inputs)) {
    request.inputs.push({ name, datatype: tensor.datatype, shape: tensor.shape });
    request.raw_input_contents.push(encodeTensor(name, tensor));
  }
  if (timeoutUs !== undefined) request.parameters.timeout = { int64_param: timeoutUs };
  if (priority !== undefined) request.parameters.priority = { uint64_param: priority };
  return request;
}

/** A ModelInferResponse -> {name: {datatype, shape, data}}. */
function parseResponse(response) {
  const result = {};
  response.outputs.forEach((tensor, i) => {
    const shape = tensor.shape.map(Number);
    result[tensor.name] = {
      datatype: tensor.datatype,
      shape,
      data: decodeTensor(tensor.datatype, shape, response.raw_output_contents[i]),
    };
  });
  return result;
}

/** An Error carrying the gRPC status name, for stream messages that failed. */
class InferError extends Error {
  constructor(id, code, message) {
    super(message);
    this.id = id;
    this.code = code; // e.g. 'DEADLINE_EXCEEDED', 'INVALID_ARGUMENT'
  }
}

function deadlineFrom(timeout) {
  return timeout === undefined ? undefined : new Date(Date.now() + timeout * 1000);
}

class Client {
  /**
   * @param {string} url host:port
   * @param {{protos?: string, credentials?: grpc.ChannelCredentials, channelOptions?: object}} [options]
   */
  constructor(url, { protos, credentials, channelOptions = {} } = {}) {
    const Service = loadService(protos);
    this.stub = new Service(url, credentials || grpc.credentials.createInsecure(), {
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      ...channelOptions,
    });
  }

  close() {
    this.stub.close();
  }

  unary(method, request, timeout) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, { deadline: deadlineFrom(timeout) }, (err, response) =>
        err ? reject(err) : resolve(response),
      );
    });
  }

  /** Whether the server (or `model`) is ready. */
  async isReady(model = '', timeout = 10) {
    if (model) return (await this.unary('ModelReady', { name: model }, timeout)).ready;
    return (await this.unary('ServerReady', {}, timeout)).ready;
  }

  /**
   * Run one request. `timeout` (seconds) is the gRPC deadline, `timeoutUs` the request's own
   * `timeout` parameter. Rejects with a grpc ServiceError (`err.code` is a grpc.status value).
   */
  async infer(model, inputs, { outputs, timeout, timeoutUs, priority, id } = {}) {
    const request = buildRequest(model, inputs, { id, outputs, timeoutUs, priority });
    return parseResponse(await this.unary('ModelInfer', request, timeout));
  }

  /**
   * Many requests over one ModelStreamInfer call, at most `maxInflight` unanswered at once.
   * `items` is an iterable or async iterable of {id, inputs} (ids default to "0", "1", ...).
   * Yields {id, outputs} or {id, error: InferError} in completion order; throws if the
   * stream itself fails.
   */
  async *streamInfer(model, items, { maxInflight = 128, timeoutUs, timeout } = {}) {
    const call = this.stub.ModelStreamInfer({ deadline: deadlineFrom(timeout) });
    const queue = [];
    let wake = null;
    const push = (event) => {
      queue.push(event);
      if (wake) wake(), (wake = null);
    };
    let inflight = 0;
    let slot = null; // resolves when a window slot frees up
    call.on('data', (message) => push({ message }));
    call.on('error', (error) => push({ error }));
    call.on('end', () => push({ end: true }));

    let writeError = null;
    const writer = (async () => {
      let n = 0;
      for await (const item of items) {
        while (inflight >= maxInflight) await new Promise((resolve) => (slot = resolve));
        inflight++;
        const id = item.id !== undefined ? String(item.id) : String(n);
        n++;
        const request = buildRequest(model, item.inputs, { id, timeoutUs: item.timeoutUs ?? timeoutUs });
        if (!call.write(request)) await new Promise((resolve) => call.once('drain', resolve));
      }
      call.end();
    })().catch((err) => {
      writeError = err;
      call.cancel();
    });

    try {
      for (;;) {
        while (queue.length === 0) await new Promise((resolve) => (wake = resolve));
        const event = queue.shift();
        if (event.end) break;
        if (event.error) throw writeError || event.error;
        inflight--;
        if (slot) slot(), (slot = null);
        const { error_message: errorMessage, infer_response: response } = event.message;
        if (errorMessage) {
          const code = response.parameters.error_code ? response.parameters.error_code.string_param : 'UNKNOWN';
          yield { id: response.id, error: new InferError(response.id, code, errorMessage) };
        } else {
          yield { id: response.id, outputs: parseResponse(response) };
        }
      }
      await writer;
      if (writeError) throw writeError;
    } finally {
      call.cancel(); // no-op once the call has ended; stops the server if the caller broke out
    }
  }
}

module.exports = { Client, InferError, buildRequest, parseResponse, encodeTensor, decodeTensor, loadService, grpc, PROTOS };

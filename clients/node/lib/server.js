'use strict';
/**
 * The server the tests talk to: TRTSERVE_URL (host:port) when set (clients/run_all.sh sets
 * it), otherwise a `trtserve serve --port 0 --http-port 0 --metrics-port 0` child process on 127.0.0.1 started from the
 * repository's .venv (TRTSERVE_PYTHON overrides the interpreter).
 */
const { spawn } = require('node:child_process');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..', '..'); // the repository

async function startServer() {
  if (process.env.TRTSERVE_URL) return { url: process.env.TRTSERVE_URL, stop: async () => {} };
  const python = process.env.TRTSERVE_PYTHON || path.join(ROOT, '.venv', 'bin', 'python');
  const args = ['-m', 'trtserve', 'serve', '--model-repository', path.join(ROOT, 'engines'), '--host', '127.0.0.1', '--port', '0', '--http-port', '0', '--metrics-port', '0'];
  const child = spawn(python, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const log = [];
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`trtserve did not start in 300 s:\n${log.join('')}`)), 300_000);
    const onData = (chunk) => {
      log.push(chunk.toString());
      const match = /listening on ([\d.]+):(\d+)/.exec(log.join(''));
      if (match) clearTimeout(timer), resolve(`${match[1]}:${match[2]}`);
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', (code) => clearTimeout(timer) || reject(new Error(`trtserve exited ${code}:\n${log.join('')}`)));
  });
  return {
    url,
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.on('exit', resolve);
        child.kill('SIGTERM');
      }),
  };
}

module.exports = { startServer };

/**
 * Structured JSON log lines (pino) behind one small interface, so call sites do not depend
 * on the logging library. Call sites pass fields, never secrets: tokens and signatures are
 * not handed to the logger anywhere, and the usual names are redacted besides.
 *
 * Line shape: `{"level":"info","time":"<ISO 8601>","pid":…,"hostname":…,…base,"msg":…,…fields}`.
 * Errors under any field name are serialised with pino's error serializer (type, message,
 * stack, code, cause). A level below the configured one costs one comparison (pino's no-op
 * methods).
 */
import { hostname } from 'node:os';
import pino from 'pino';

export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  /** Optional: loggers that have no debug level drop these lines. */
  debug?(msg: string, fields?: Record<string, unknown>): void;
  /**
   * Optional: an error line written before the call returns, after the lines still queued, for
   * the last line of a process that ends itself without exit's flush (SIGKILL). Without it,
   * `error`.
   */
  errorNow?(msg: string, fields?: Record<string, unknown>): void;
}

export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Where lines go: anything with `write(line)`. */
export interface LogDestination {
  write(line: string): unknown;
}

export interface JsonLoggerOptions {
  /** Lowest level written (default `info`). */
  level?: LogLevel;
}

/** Field names whose values never reach a log line, whatever a future call site passes. */
const REDACT = [
  'authorization',
  'token',
  'password',
  'secret',
  'signature',
  '*.authorization',
  '*.token',
  '*.password',
  '*.secret',
  '*.signature',
  'headers.authorization',
  'headers["x-connector-signature"]',
];

/**
 * A logger writing one JSON line per call to `destination` (default: stderr, written
 * asynchronously by pino's sonic-boom, on libuv's pool, and flushed at exit; `errorNow`
 * writes there synchronously: a SIGKILL right after an asynchronous line mostly lost it).
 */
export function jsonLogger(destination?: LogDestination, base: Record<string, unknown> = {}, opts: JsonLoggerOptions = {}): Logger {
  const options: pino.LoggerOptions = {
    level: opts.level ?? 'info',
    base: { pid: process.pid, hostname: hostname(), ...base },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
    redact: { paths: REDACT, censor: '[Redacted]' },
  };
  const stderr = destination ? null : pino.destination({ dest: 2, sync: false });
  const logger = pino(options, (destination ?? stderr) as pino.DestinationStream);
  const error = (msg: string, fields?: Record<string, unknown>) => (fields ? logger.error(serialise(fields), msg) : logger.error(msg));
  return {
    info: (msg, fields) => (fields ? logger.info(serialise(fields), msg) : logger.info(msg)),
    warn: (msg, fields) => (fields ? logger.warn(serialise(fields), msg) : logger.warn(msg)),
    error,
    debug: (msg, fields) => (fields ? logger.debug(serialise(fields), msg) : logger.debug(msg)),
    errorNow: (msg, fields) => {
      if (!stderr) return error(msg, fields);
      try {
        // The lines queued behind a write in flight go first (that one may still come after).
        stderr.flushSync();
      } catch {
        // Not open yet, or the write failed: the line below is written all the same.
      }
      const now = pino(options, pino.destination({ dest: 2, sync: true }));
      if (fields) now.error(serialise(fields), msg);
      else now.error(msg);
    },
  };
}

export const silentLogger: Logger = { info() {}, warn() {}, error() {}, debug() {} };

function serialise(fields: Record<string, unknown>): Record<string, unknown> {
  let out: Record<string, unknown> | undefined;
  for (const [k, v] of Object.entries(fields)) {
    if (v instanceof Error) {
      out ??= { ...fields };
      out[k] = pino.stdSerializers.err(v);
    }
  }
  return out ?? fields;
}

/** How much of each part of a library's console output a log line keeps, at most. */
const LIBRARY_TEXT_CHARS = 100;

/**
 * Turns what libraries print with `console` into log lines (`library output`, level warn) that
 * keep only the head of each part: its text up to the first `": "`, at most
 * `LIBRARY_TEXT_CHARS`. nats.js 2.29 prints a protocol error with the bytes it failed on
 * (`reader closed Error: parse error [state]: <bytes>`), which are the clients' rows in
 * flight; they reach neither stdout nor the log. Node's own warnings keep their first line.
 * For the processes' entry points only: the console is the process's.
 */
export function captureConsole(log: Logger, target: Pick<Console, 'log' | 'info' | 'debug' | 'warn' | 'error'> = console): void {
  const write = (...parts: unknown[]): void => log.warn('library output', { text: parts.map(headOf).join(' ') });
  target.log = write;
  target.info = write;
  target.debug = write;
  target.warn = write;
  target.error = write;
}

/** Node's own warnings (`(node:<pid>) <Name>: <message>`, printed with `console.error`): no data of ours, kept to their first line. */
const NODE_WARNING = /^\(node:\d+\) /;

function headOf(part: unknown): string {
  if (typeof part === 'string' && NODE_WARNING.test(part)) return part.split('\n', 1)[0]!.slice(0, 3 * LIBRARY_TEXT_CHARS);
  const text = part instanceof Error ? `${part.name}: ${part.message}` : typeof part === 'string' ? part : `[${typeof part}]`;
  const error = part instanceof Error ? part.name.length + 2 : 0;
  const cut = text.indexOf(': ', error);
  return (cut < 0 ? text : text.slice(0, cut)).slice(0, LIBRARY_TEXT_CHARS);
}

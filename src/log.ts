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
 * asynchronously by pino's sonic-boom and flushed at exit).
 */
export function jsonLogger(destination?: LogDestination, base: Record<string, unknown> = {}, opts: JsonLoggerOptions = {}): Logger {
  const target = destination ?? pino.destination({ dest: 2, sync: false });
  const logger = pino(
    {
      level: opts.level ?? 'info',
      base: { pid: process.pid, hostname: hostname(), ...base },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      redact: { paths: REDACT, censor: '[Redacted]' },
    },
    target as pino.DestinationStream,
  );
  return {
    info: (msg, fields) => (fields ? logger.info(serialise(fields), msg) : logger.info(msg)),
    warn: (msg, fields) => (fields ? logger.warn(serialise(fields), msg) : logger.warn(msg)),
    error: (msg, fields) => (fields ? logger.error(serialise(fields), msg) : logger.error(msg)),
    debug: (msg, fields) => (fields ? logger.debug(serialise(fields), msg) : logger.debug(msg)),
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

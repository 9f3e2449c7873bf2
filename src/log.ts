/**
 * Structured JSON log lines on stderr. Call sites pass fields, never secrets: tokens and
 * signatures are not handed to the logger anywhere.
 */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

export function jsonLogger(stream: NodeJS.WritableStream = process.stderr, base: Record<string, unknown> = {}): Logger {
  const write = (level: string, msg: string, fields?: Record<string, unknown>) => {
    stream.write(`${JSON.stringify({ time: new Date().toISOString(), level, msg, ...base, ...serialise(fields) })}\n`);
  };
  return {
    info: (msg, fields) => write('info', msg, fields),
    warn: (msg, fields) => write('warn', msg, fields),
    error: (msg, fields) => write('error', msg, fields),
  };
}

export const silentLogger: Logger = { info() {}, warn() {}, error() {} };

function serialise(fields: Record<string, unknown> | undefined): Record<string, unknown> | undefined {
  if (!fields) return fields;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(fields)) {
    out[k] = v instanceof Error ? { name: v.name, message: v.message, code: (v as { code?: unknown }).code, stack: v.stack } : v;
  }
  return out;
}

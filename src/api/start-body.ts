/**
 * The start-upload body `{date_from, date_to}`, validated as Pydantic v2 would (the 422
 * arrays of DECISIONS.md): field errors first, all of them; the cross-field rules only
 * once both dates parsed.
 */
import type { ValidationIssue } from '../errors.js';
import { calendarDateError } from '../entities/dates.js';

export type StartDates = { date_from: string; date_to: string } | { issues: ValidationIssue[] };

export function parseStartBody(raw: Buffer, today: string): StartDates {
  let body: unknown;
  try {
    body = JSON.parse(raw.toString('utf8'));
  } catch (err) {
    return {
      issues: [{ type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: (err as Error).message } }],
    };
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    return {
      issues: [{ type: 'model_attributes_type', loc: ['body'], msg: 'Input should be a valid dictionary or object to extract fields from', input: body }],
    };
  }
  const fields = body as Record<string, unknown>;
  const issues: ValidationIssue[] = [];
  for (const name of ['date_from', 'date_to'] as const) {
    const value = fields[name];
    if (value === undefined) {
      issues.push({ type: 'missing', loc: ['body', name], msg: 'Field required', input: body });
    } else if (typeof value !== 'string') {
      issues.push({ type: 'date_type', loc: ['body', name], msg: 'Input should be a valid date', input: value });
    } else {
      const reason = calendarDateError(value);
      if (reason) {
        issues.push({
          type: 'date_from_datetime_parsing',
          loc: ['body', name],
          msg: `Input should be a valid date or datetime, ${reason}`,
          input: value,
          ctx: { error: reason },
        });
      }
    }
  }
  if (issues.length) return { issues };
  const dateFrom = fields.date_from as string;
  const dateTo = fields.date_to as string;
  const valueError = (error: string): StartDates => ({
    issues: [{ type: 'value_error', loc: ['body', 'date_to'], msg: `Value error, ${error}`, input: dateTo, ctx: { error } }],
  });
  if (dateFrom > dateTo) return valueError('date_from must be earlier than or equal to date_to');
  if (dateTo >= today) return valueError(`date_to must be earlier than today (${today})`);
  return { date_from: dateFrom, date_to: dateTo };
}

/** The UTC calendar date of `now`, `YYYY-MM-DD`. */
export function utcToday(now: number): string {
  return new Date(now).toISOString().slice(0, 10);
}

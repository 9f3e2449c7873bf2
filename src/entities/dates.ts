/**
 * Calendar-date checks typia's `Format<"date">` does not do (it accepts 2024-02-31).
 * Shared by the start-upload body and the row validators.
 */

const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;

/** null for a real `YYYY-MM-DD` date, else the reason in Pydantic's words. */
export function calendarDateError(value: string): string | null {
  const m = DATE.exec(value);
  if (!m) return value.length < 10 ? 'input is too short' : 'invalid date format, expected YYYY-MM-DD';
  const month = Number(m[2]);
  const day = Number(m[3]);
  if (month < 1 || month > 12) return 'month value is outside expected range';
  if (day < 1 || day > daysInMonth(Number(m[1]), month)) return 'day value is outside expected range';
  return null;
}

export function isCalendarDate(value: string): boolean {
  return calendarDateError(value) === null;
}

export function daysInMonth(year: number, month: number): number {
  if (month === 2) return year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28;
  return month === 4 || month === 6 || month === 9 || month === 11 ? 30 : 31;
}

import type { WebhookPayload, WorkflowObject, WorkflowStart } from '../types.js';

const MAX_PROBLEMS_LISTED = 5;

/** Counts the objects of a start request as they are read, then compares them with the request. */
export class Tally {
  readonly #req: WorkflowStart;
  /** The first problems, and how many there were: a session of a million objects can have as many. */
  readonly #problems: string[] = [];
  #problemCount = 0;
  readonly #perEntity: Map<string, number>;
  #total = 0;

  constructor(req: WorkflowStart) {
    this.#req = req;
    this.#perEntity = new Map(req.entities.map((e) => [e.name, 0]));
  }

  problem(text: string): void {
    if (this.#problemCount++ < MAX_PROBLEMS_LISTED) this.#problems.push(text);
  }

  /** `rows` null: the object is missing. */
  add(obj: WorkflowObject, rows: number | null): void {
    if (rows === null) this.problem(`object ${obj.key} is missing`);
    else if (rows !== obj.rows) this.problem(`object ${obj.key} declared ${obj.rows} rows, found ${rows}`);
    this.#perEntity.set(obj.entity, (this.#perEntity.get(obj.entity) ?? 0) + (rows ?? 0));
    this.#total += rows ?? 0;
  }

  judge(): { entities: { name: string; rows: number }[]; payload: WebhookPayload } {
    for (const e of this.#req.entities) {
      const rows = this.#perEntity.get(e.name) ?? 0;
      if (rows !== e.rows) this.problem(`entity ${e.name} declared ${e.rows} rows, found ${rows}`);
    }
    const entities = [...this.#perEntity].map(([name, rows]) => ({ name, rows }));
    const base = { upload_uuid: this.#req.upload_uuid, is_terminated: false };
    if (this.#problemCount === 0) return { entities, payload: { ...base, status: 'succeeded', message: `Processed ${this.#total} rows` } };
    const listed = this.#problems.join('; ');
    const more = this.#problemCount > MAX_PROBLEMS_LISTED ? ` (and ${this.#problemCount - MAX_PROBLEMS_LISTED} more)` : '';
    return { entities, payload: { ...base, status: 'failed', message: `Row count mismatch: ${listed}${more}` } };
  }
}

/**
 * The emulator's state file: the workflows not yet done, as JSON (`{version, workflows}`),
 * read back at `open` (invalid entries dropped, a corrupt file kept aside).
 */
import { mkdir, readFile, rename } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { WebhookPayload } from '../types.js';

export const STATE_VERSION = 1;

/**
 * One workflow not yet done, as kept in the state file. `running`: waiting for `due_at`
 * (terminate still possible); `completing`: sending `outcome`; `terminating`: sending the
 * terminate confirmation. Removed once its webhook was delivered (2xx) or given up.
 */
export interface WorkflowRecord {
  upload_uuid: string;
  workflow_id: string;
  callback_url: string;
  /** When the completion webhook is due, epoch ms. */
  due_at: number;
  phase: 'running' | 'completing' | 'terminating';
  /** The completion webhook, judged at start from the counted rows. */
  outcome: WebhookPayload;
}

/** The saved workflows; [] for a missing or unparsable file (logged, the latter kept aside). */
export async function loadState(file: string, log: ((msg: string, data: Record<string, unknown>) => void) | undefined): Promise<WorkflowRecord[]> {
  await mkdir(dirname(file), { recursive: true });
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    log?.('connector emulator: no state file, starting empty', { file });
    return [];
  }
  let workflows: unknown[];
  try {
    const state: unknown = JSON.parse(text);
    if (!isObject(state) || state.version !== STATE_VERSION || !Array.isArray(state.workflows)) {
      throw new Error(`not a version ${STATE_VERSION} state file`);
    }
    workflows = state.workflows;
  } catch (err) {
    const aside = `${file}.corrupt-${Date.now()}`;
    const kept = await rename(file, aside).then(
      () => aside,
      () => null,
    );
    log?.('connector emulator: corrupt state file, starting empty', { file, kept_as: kept, err });
    return [];
  }
  const valid: WorkflowRecord[] = [];
  for (const wf of workflows) {
    if (isWorkflowRecord(wf)) valid.push(wf);
    else log?.('connector emulator: invalid saved workflow dropped', { file, workflow: wf });
  }
  return valid;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const isString = (v: unknown): v is string => typeof v === 'string' && v !== '';

function isWorkflowRecord(v: unknown): v is WorkflowRecord {
  if (!isObject(v) || !isObject(v.outcome)) return false;
  const o = v.outcome;
  return (
    isString(v.upload_uuid) &&
    isString(v.workflow_id) &&
    isString(v.callback_url) &&
    typeof v.due_at === 'number' &&
    Number.isFinite(v.due_at) &&
    (v.phase === 'running' || v.phase === 'completing' || v.phase === 'terminating') &&
    o.upload_uuid === v.upload_uuid &&
    typeof o.is_terminated === 'boolean' &&
    (o.status === undefined || o.status === 'succeeded' || o.status === 'failed' || o.status === 'terminated') &&
    (o.message === undefined || typeof o.message === 'string')
  );
}

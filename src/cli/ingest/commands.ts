/**
 * The session commands but push: init, status, start, terminate, delete, entities; and the polls they wait with.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { IngestClient } from '../../client/client.js';
import { CLI_DEFAULTS } from '../../client/defaults.js';
import { UsageError } from '../../client/cli-config.js';
import { ApiError, ClientError, isApiError, isRecord } from '../../client/errors.js';
import type { InitializeResult, OperationResult, StartResult, StatusView } from '../../client/types.js';
import { seconds, str } from './args.js';
import { callOpts, EXIT, type Answer, type Cli } from './context.js';

export class WaitTimeout extends Error {
  override readonly name = 'WaitTimeout';
  readonly code = 'WAIT_TIMEOUT';
  constructor(
    message: string,
    readonly last: StatusView | null,
  ) {
    super(message);
  }
}

/** An initialize-session answer; `answer_lost`: an earlier attempt went unanswered (see `initialize`). */
export type Initialized = InitializeResult & { answer_lost?: true };

/**
 * initialize-session, retried. After an attempt that went unanswered, an `already_exists`
 * may name the session that attempt made, or one that was open before: the service's answers
 * do not tell the two apart (the 409 carries no creation time), so it is marked, not taken
 * as made.
 */
export function initialize(cli: Cli, client: IngestClient): Promise<Initialized> {
  return cli.change<Initialized>(
    () => client.initialize(callOpts(cli)),
    async (last) => ('value' in last && last.value.status === 'already_exists' ? { ...last.value, answer_lost: true } : undefined),
  );
}

/** The initialize-session 409 as an error that names the session in the way. */
export function initConflict(init: Exclude<Initialized, { status: 'created' }>): ApiError {
  const hint = init.status === 'already_exists' ? 'push with --upload to add to it, or delete it' : 'wait for it, or terminate it';
  const lost = init.answer_lost
    ? "; an earlier attempt's answer was lost, so this may be the session that attempt created (the service's answers do not tell it from one open before)"
    : '';
  return new ApiError(409, { ...init, detail: `${init.message}: upload ${init.upload_uuid} is ${init.session_status} (${hint})${lost}` }, null);
}

export async function initCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const init = await initialize(cli, client);
  await cli.remember(init.upload_uuid);
  if (init.status === 'created') {
    cli.print(init, init.upload_uuid);
    return EXIT.OK;
  }
  throw initConflict(init);
}

/** The states `status --watch --until` can wait for. */
const UNTIL: Record<string, (s: StatusView) => boolean> = {
  DONE: (s) => s.session_status === 'DONE',
  UPLOADING: (s) => s.session_status === 'UPLOADING',
  STARTED: (s) => s.session_status === 'STARTED',
  startable: (s) => s.can_start_upload,
};

export async function statusCommand(cli: Cli): Promise<number> {
  const untilName = str(cli.values.until) ?? 'DONE';
  const until = UNTIL[untilName];
  if (!until) throw new UsageError(`--until: expected ${Object.keys(UNTIL).join(', ')}, got ${JSON.stringify(untilName)}`);
  if (cli.values.until !== undefined && !cli.values.watch) throw new UsageError('--until goes with --watch');
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  if (!cli.values.watch) {
    const status = await cli.call(() => client.status(uuid, callOpts(cli)));
    cli.print(status, describeStatus(status));
    return EXIT.OK;
  }
  const interval = seconds(cli.values.interval, 'interval', CLI_DEFAULTS.watchIntervalSeconds, 0.2) * 1000;
  let last = '';
  await poll(cli, client, uuid, interval, (status) => {
    const key = JSON.stringify(status);
    if (key !== last) cli.print(status, `${new Date().toISOString()} ${describeStatus(status)}`);
    last = key;
    return until(status);
  });
  return EXIT.OK;
}

export async function startCommand(cli: Cli): Promise<number> {
  const from = str(cli.values.from);
  if (!from) throw new UsageError('start: --from YYYY-MM-DD is required');
  const to = str(cli.values.to) ?? new Date(Date.now() - 86_400_000).toISOString().slice(0, 10);
  for (const [name, value] of [['from', from], ['to', to]] as const) {
    if (!/^\d{4}-\d{2}-\d{2}$/.test(value)) throw new UsageError(`--${name}: expected YYYY-MM-DD, got ${JSON.stringify(value)}`);
  }
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  const interval = seconds(cli.values.interval, 'interval', CLI_DEFAULTS.waitIntervalSeconds, 0.2) * 1000;

  // Wait for can_start_upload; a session that cannot become startable by waiting is sent
  // to start-upload anyway, so that the service says why.
  let ready = await poll(cli, client, uuid, interval, (s) => s.can_start_upload || s.session_status !== 'UPLOADING' || s.entities.length === 0);
  if (!ready.can_start_upload) cli.note(`upload ${uuid} cannot start: ${describeStatus(ready)}`);
  let started: Record<string, unknown>;
  for (;;) {
    try {
      const before = ready;
      started = await cli.change(
        () => client.start(uuid, { date_from: from, date_to: to }, callOpts(cli)),
        (last) => settleStart(cli, client, before, last),
      );
      break;
    } catch (err) {
      // A package committed between our poll and the call: wait again.
      if (!(isApiError(err) && err.status === 409 && err.detail === 'Upload tasks are still in progress')) throw err;
      ready = await poll(cli, client, uuid, interval, (s) => s.can_start_upload || s.session_status !== 'UPLOADING');
    }
  }
  await cli.remember(uuid);
  if (!cli.values.wait) {
    cli.print(started, `started upload ${uuid}: ${JSON.stringify(started)}`);
    return EXIT.OK;
  }
  cli.note(`started upload ${uuid}; waiting for DONE`);
  const end = await poll(cli, client, uuid, interval, (s) => s.session_status !== 'STARTED');
  const ok = end.session_status === 'DONE';
  const outcome = end.last_workflow ? `${end.last_workflow.status}${end.last_workflow.message ? `: ${end.last_workflow.message}` : ''}` : end.session_status;
  cli.print({ start: started, status: end, ok }, ok ? `upload ${uuid} is DONE` : `upload ${uuid} is back to ${end.session_status} (${outcome})`);
  return ok ? EXIT.OK : EXIT.FAILED;
}

export async function terminateCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  const result = await cli.change<Settled>(
    () => client.terminate(uuid, callOpts(cli)),
    (last) => settleTerminate(cli, client, uuid, last),
  );
  if (!cli.values.wait) {
    cli.print(result, result.message);
    return EXIT.OK;
  }
  const interval = seconds(cli.values.interval, 'interval', CLI_DEFAULTS.waitIntervalSeconds, 0.2) * 1000;
  const end = await poll(cli, client, uuid, interval, (s) => s.session_status !== 'STARTED');
  cli.print({ terminate: result, status: end }, `upload ${uuid} is ${end.session_status}`);
  return end.session_status === 'UPLOADING' ? EXIT.OK : EXIT.FAILED;
}

export async function deleteCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  const result = await cli.change<Settled>(
    () => client.delete(uuid, callOpts(cli)),
    (last) => settleDelete(cli, client, uuid, last),
  );
  const creds = await cli.creds();
  if ((await cli.memory.get(creds.url, creds.clientId)) === uuid) await cli.remember(null);
  cli.print(result, result.message);
  return EXIT.OK;
}

export async function entitiesCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const catalog = await cli.call(() => client.entities(callOpts(cli)));
  const human = catalog.entities
    .map((e) => `${e.name}${e.parents.length ? ` (parents: ${e.parents.join(', ')})` : ''}\n${e.columns.map((c) => `  ${c.name}${c.required ? '*' : ''} ${c.type}`).join('\n')}`)
    .join('\n');
  cli.print(catalog, human);
  return EXIT.OK;
}

/**
 * A start after an attempt that went unanswered: a 409 `actual` STARTED or DONE of a session
 * that was UPLOADING when the call began is what that attempt did (start-upload sets STARTED
 * before it answers), so the call started the session; its status stands for the Connector's
 * answer, which is lost.
 */
async function settleStart(cli: Cli, client: IngestClient, before: StatusView, last: Answer<StartResult>): Promise<StartResult | undefined> {
  const actual = 'error' in last && last.error.status === 409 && isRecord(last.error.detail) ? last.error.detail.actual : undefined;
  if ((actual !== 'STARTED' && actual !== 'DONE') || before.session_status !== 'UPLOADING') return undefined;
  const uuid = before.upload_uuid;
  const status = await cli.call(() => client.status(uuid, callOpts(cli)));
  cli.note(`upload ${uuid}: start-upload's answer was lost, and its retry found the session ${actual}: it started`);
  return { answer_lost: true, status };
}

/** A delete's or terminate's answer; `answer_lost`: the call's was lost, and what it asked for is done (see `settleDelete`, `settleTerminate`). */
type Settled = OperationResult & { answer_lost?: true };

/**
 * A terminate after an attempt that went unanswered: a refusal for want of a running workflow
 * (404, 409) is what that attempt did when the session is still STARTED (its workflow
 * stopping: the Connector no longer runs it) or back in UPLOADING from a terminated workflow.
 */
async function settleTerminate(cli: Cli, client: IngestClient, uuid: string, last: Answer<Settled>): Promise<Settled | undefined> {
  if (!('error' in last) || (last.error.status !== 404 && last.error.status !== 409)) return undefined;
  const status = await cli.call(() => client.status(uuid, callOpts(cli)));
  const stopped = status.session_status === 'STARTED' || (status.session_status === 'UPLOADING' && status.last_workflow?.status === 'terminated');
  if (!stopped) return undefined;
  cli.note(`upload ${uuid}: terminate's answer was lost, and its retry found the workflow no longer running: it was stopped`);
  return { status: 'started', message: `Workflow stop requested: upload ${uuid}'s workflow no longer runs (the answer to terminate was lost)`, answer_lost: true };
}

/**
 * A delete after an attempt that went unanswered: a refusal for want of the session (400 none
 * active, 403 another one made since, 404) is what that attempt did when the session's own
 * status is 404 too.
 */
async function settleDelete(cli: Cli, client: IngestClient, uuid: string, last: Answer<Settled>): Promise<Settled | undefined> {
  if (!('error' in last) || ![400, 403, 404].includes(last.error.status)) return undefined;
  try {
    await cli.call(() => client.status(uuid, callOpts(cli)));
    return undefined; // still there: the refusal stands
  } catch (err) {
    if (!(isApiError(err) && err.status === 404)) throw err;
  }
  return { status: 'started', message: `Upload deletion started: upload ${uuid} is gone (the answer to delete was lost)`, answer_lost: true };
}

/** Polls status until `done` holds; bounded by --wait-timeout. Transient failures are retried. */
async function poll(cli: Cli, client: IngestClient, uuid: string, intervalMs: number, done: (s: StatusView) => boolean): Promise<StatusView> {
  const deadline = Date.now() + cli.waitTimeoutMs;
  let status: StatusView | null = null;
  for (;;) {
    status = await cli.call(() => client.status(uuid, callOpts(cli)));
    if (done(status)) return status;
    if (Date.now() + intervalMs > deadline) throw new WaitTimeout(`upload ${uuid}: still ${describeStatus(status)} after ${cli.waitTimeoutMs / 1000} s`, status);
    try {
      await sleep(intervalMs, undefined, cli.signal ? { signal: cli.signal } : undefined);
    } catch (err) {
      throw new ClientError('ABORTED', 'interrupted', { cause: err });
    }
  }
}

function describeStatus(s: StatusView): string {
  const flags = [
    `entities: ${s.entities.length ? s.entities.join(', ') : '–'}`,
    `tasks finished: ${s.upload_tasks_finished ? 'yes' : 'no'}`,
    `can upload: ${s.can_upload_entities ? 'yes' : 'no'}`,
    `can start: ${s.can_start_upload ? 'yes' : 'no'}`,
    `can terminate: ${s.can_terminate ? 'yes' : 'no'}`,
  ];
  const last = s.last_workflow ? ` · last workflow ${s.last_workflow.status}${s.last_workflow.message ? ` (${s.last_workflow.message})` : ''}` : '';
  return `${s.upload_uuid} ${s.session_status} · ${flags.join(' · ')}${last}`;
}

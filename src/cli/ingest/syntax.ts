/**
 * The command line's grammar: the commands and their options, and the help that tells them.
 */
import type { ParseArgsConfig } from 'node:util';
import { CLI_DEFAULTS, CLIENT_DEFAULTS } from '../../client/defaults.js';
import { MAX_PARALLEL } from './args.js';

export const HELP = `Usage: ingest <command> [options]

Commands:
  push <file...> --entity E  Send CSV, NDJSON or JSON files of one entity into the session:
                           files, folders (their .csv/.ndjson/.jsonl/.json files, by name)
                           or - (standard input, with --format), one after another
      [--upload UUID | --new]  session: the given one; --new: a new one (fails if one is
                           open); default: the client's open session, else a new one
      [--format csv|ndjson|json]  default from the extension (.csv, .ndjson/.jsonl, .json)
      [--package-size ${CLI_DEFAULTS.packageSize}]  largest package body (B, KiB, MiB, KB, MB; at most 32 MiB);
                           a file already partly stored in the session is cut as then
      [--parallel ${CLI_DEFAULTS.parallel}]       packages in flight at once (1-${MAX_PARALLEL})
      [--rate ${CLI_DEFAULTS.rate}]          requests started per second at most (the service allows 30)
      [--retries ${CLI_DEFAULTS.retries}]        retries of a package on 408/429/502/503/504, a 409 with
                           Retry-After, timeouts, network errors
      [--gzip]             compress packages on the wire
      [--keep-going]       send the remaining packages after one failed
      [--dry-run]          check every package without storing it: the service answers
                           what each would get (implies --keep-going); nothing is stored
      [--errors FILE]      write every record not accepted to FILE with its problems, all of
                           them (past the service's first 100 of a package, by dry runs):
                           fix the values there and push FILE. CSV inputs: CSV (*.csv), their
                           header plus _record and a last column _errors ("price: expected
                           number >= 0, got -1; …"). NDJSON and JSON inputs: NDJSON (*.ndjson,
                           *.jsonl), each record plus "_record" and "_errors": [{column,
                           message}]. A refused package's other records too, without errors
                           (a package is stored whole or not at all). Several inputs add
                           _file; CSV and NDJSON/JSON do not mix. Renamed into place at the
                           end; nothing refused: no FILE (an older one removed). Implies
                           --keep-going; with --dry-run: what a real push would not accept
  status [UUID] [--watch [--until STATE]] [--interval ${CLI_DEFAULTS.watchIntervalSeconds}]
                           The session's status; --watch prints each change until the
                           session is DONE, or --until startable (can_start_upload),
                           UPLOADING or STARTED; bounded by --wait-timeout
  start [UUID] --from YYYY-MM-DD [--to YYYY-MM-DD] [--wait]
                           Waits until can_start_upload, then starts the Connector
                           (--to defaults to yesterday, UTC); --wait: until DONE
  terminate [UUID] [--wait]  Stops the workflow; --wait: until the session is UPLOADING
  delete [UUID]            Deletes a session that is still UPLOADING
  init                     Initializes a session and prints its uuid
  entities                 The entity catalog (columns, types, required)

Options of every command:
  --url URL  --client-id ID  --token TOKEN
                           Credentials (else INGEST_URL, INGEST_CLIENT_ID, INGEST_TOKEN,
                           else the config file); a token in the environment or the
                           config file stays out of the process list
  --config FILE            JSON {"url", "client_id", "token"} (else $INGEST_CONFIG, else
                           ~/.config/ingest/config.json)
  --json                   Machine-readable output on stdout (errors too, as {"error": …})
  --quiet, -q              No progress lines
  --timeout SECONDS        Deadline of each call (default ${CLI_DEFAULTS.timeoutSeconds}; ingest calls ${CLIENT_DEFAULTS.ingestTimeoutMs / 1000})
  --wait-timeout SECONDS   Bound of --wait and --watch (default ${CLI_DEFAULTS.waitTimeoutSeconds})
  --help, -h               This help; --version, -V

Without UUID, a command uses the session of the last init or push (per URL and client).

Files:
  CSV     header row = column names; quotes, embedded newlines, BOM and CRLF allowed; values
          typed by the entity's catalog (numbers, integers, booleans true/false/1/0/yes/no);
          an empty field is null in an optional column
  NDJSON  one object per line keyed by column name, or a first line with the column
          names as an array and one array of values per further line
  JSON    {"columns": [...], "data": [[...], ...]} or an array of objects
  Reserved names: columns and keys named _errors, _record or _file (what --errors adds) are
  dropped when a file is read, so a fixed errors file is pushed as it is.
  Re-running the same push of the same file into the same session sends the same
  Idempotency-Key per package, so packages already stored are not stored twice.

Exit codes:
  0 done  1 the service refused or could not be reached  2 usage or configuration
  3 push partly failed (some packages accepted)  4 the file is not valid input
  5 --wait/--watch timed out  70 internal error  130 interrupted
`;

export const GLOBAL: ParseArgsConfig['options'] = {
  url: { type: 'string' },
  'client-id': { type: 'string' },
  token: { type: 'string' },
  config: { type: 'string' },
  json: { type: 'boolean' },
  quiet: { type: 'boolean', short: 'q' },
  timeout: { type: 'string' },
  'wait-timeout': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

export const COMMANDS: Record<string, { options: ParseArgsConfig['options']; positionals: number }> = {
  push: {
    positionals: Infinity,
    options: {
      entity: { type: 'string', short: 'e' },
      upload: { type: 'string' },
      new: { type: 'boolean' },
      'package-size': { type: 'string' },
      parallel: { type: 'string' },
      format: { type: 'string' },
      rate: { type: 'string' },
      retries: { type: 'string' },
      gzip: { type: 'boolean' },
      'keep-going': { type: 'boolean' },
      'dry-run': { type: 'boolean' },
      errors: { type: 'string' },
    },
  },
  status: {
    positionals: 1,
    options: { upload: { type: 'string' }, watch: { type: 'boolean' }, until: { type: 'string' }, interval: { type: 'string' } },
  },
  start: {
    positionals: 1,
    options: { upload: { type: 'string' }, from: { type: 'string' }, to: { type: 'string' }, wait: { type: 'boolean' }, interval: { type: 'string' } },
  },
  terminate: { positionals: 1, options: { upload: { type: 'string' }, wait: { type: 'boolean' }, interval: { type: 'string' } } },
  delete: { positionals: 1, options: { upload: { type: 'string' } } },
  init: { positionals: 0, options: {} },
  entities: { positionals: 0, options: {} },
};

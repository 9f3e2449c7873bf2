/**
 * Peer 1, the pipeline the first design named, taken literally: the request streamed through
 * stream-json's `parser()` → `pick({filter: 'data'})` → `streamArray()` on the main thread,
 * each row validated with the service's `compileRowCheck` as it comes out.
 *
 * The column list is read off the parser's token stream before `data` starts (a listener
 * that detaches itself at the `data` key, so rows cost it nothing). A body whose `data`
 * comes before `columns` is checked in catalog column order: this peer is a baseline for
 * throughput, not a second implementation of every edge of the check order.
 */
import { pipeline, Writable } from 'node:stream';
import type { Readable } from 'node:stream';
import StreamJson from 'stream-json';
import Pick from 'stream-json/filters/Pick.js';
import StreamArray from 'stream-json/streamers/StreamArray.js';
import type { EntitySpec } from '../../src/entities/catalog.js';
import { INVALID_JSON, columnsError, compileRowCheck, type RowCheck } from '../../src/entities/validators.js';
import { BodyTooLarge, isZlibError, startPeer, success, unprocessable, type PeerReply } from './http-peer.js';

interface Token {
  name: string;
  value?: unknown;
}

const NOT_A_STRING = Symbol('not a string');

function ingest(entity: EntitySpec, body: Readable): Promise<PeerReply> {
  return new Promise((resolve, reject) => {
    const tokens = StreamJson.parser();
    let failure: PeerReply | null = null;
    let check: RowCheck | null = null;
    let sawData = false;
    let rows = 0;

    // Column capture: depth 1 is inside the top-level object, depth 2 inside `columns`.
    let depth = 0;
    let key: string | null = null;
    let collecting = false;
    const names: unknown[] = [];
    const finishColumns = () => {
      const bad = names.findIndex((n) => typeof n !== 'string');
      if (bad >= 0) {
        failure = unprocessable([{ type: 'string_type', loc: ['body', 'columns', bad], msg: 'Input should be a valid string', input: null }]);
        return;
      }
      const message = columnsError(entity, names as string[]);
      if (message) failure = unprocessable(message);
      else check = compileRowCheck(entity, names as string[]);
    };
    const watch = (t: Token) => {
      switch (t.name) {
        case 'startObject':
        case 'startArray':
          if (collecting && depth === 2) names.push(NOT_A_STRING);
          depth++;
          if (t.name === 'startArray' && depth === 2 && key === 'columns') collecting = true;
          break;
        case 'endObject':
        case 'endArray':
          depth--;
          if (collecting && depth === 1) {
            collecting = false;
            finishColumns();
          }
          break;
        case 'keyValue':
          if (depth === 1) {
            key = t.value as string;
            if (key === 'data') {
              sawData = true;
              tokens.off('data', watch);
            }
          }
          break;
        case 'stringValue':
          if (collecting && depth === 2) names.push(t.value);
          break;
        case 'numberValue':
        case 'nullValue':
        case 'trueValue':
        case 'falseValue':
          if (collecting && depth === 2) names.push(NOT_A_STRING);
          break;
      }
    };
    tokens.on('data', watch);

    const sink = new Writable({
      objectMode: true,
      write({ key: index, value }: { key: number; value: unknown }, _enc, cb) {
        rows++;
        if (failure === null) {
          if (!Array.isArray(value)) {
            failure = unprocessable([{ type: 'list_type', loc: ['body', 'data', index], msg: 'Input should be a valid list', input: null }]);
          } else {
            check ??= compileRowCheck(entity, entity.columns.map((c) => c.name));
            const message = check(value, index);
            if (message) failure = unprocessable(message);
          }
        }
        cb();
      },
    });

    pipeline(body, tokens, Pick.pick({ filter: 'data' }), StreamArray.streamArray(), sink, (err) => {
      if (err) {
        if (err instanceof BodyTooLarge) reject(err);
        else if (isZlibError(err) || isParseError(err)) resolve(unprocessable(INVALID_JSON));
        else if (/should be an array/.test(err.message)) {
          resolve(unprocessable([{ type: 'list_type', loc: ['body', 'data'], msg: 'Input should be a valid list', input: null }]));
        } else reject(err);
        return;
      }
      if (failure) resolve(failure);
      else if (!sawData && names.length === 0 && check === null) {
        resolve(unprocessable([{ type: 'missing', loc: ['body', 'columns'], msg: 'Field required', input: null }]));
      } else if (!sawData) {
        resolve(unprocessable([{ type: 'missing', loc: ['body', 'data'], msg: 'Field required', input: null }]));
      } else resolve(success(entity, rows));
    });
  });
}

/** stream-json reports bad input as plain Errors whose message starts "Parser cannot parse input". */
function isParseError(err: Error): boolean {
  return /^Parser (cannot parse input|has expected)/.test(err.message);
}

startPeer(ingest);

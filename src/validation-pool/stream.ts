/**
 * The streaming ingest sink: a body's bytes go on to the workers as they arrive, in pieces
 * of whole rows, and the answer is exactly the one `JSON.parse` of the whole body followed
 * by the checks of `validators.ts` would give (the one-shot `validateBody` of the worker).
 *
 * How the pieces stay exact:
 * - The head (bytes before `data`'s elements) is scanned here (`validation/head.ts`); a layout it does
 *   not stream (`data` before `columns`, not an object, …) goes to the one-shot task whole.
 * - The elements are cut at guessed boundaries (`validation/cutter.ts`) and parsed speculatively, each
 *   piece as if its cut were right. Results are taken in piece order; a piece counts only
 *   when the piece before it ended on a real boundary. A piece whose exact scan shows that
 *   its end was not a boundary hands its unfinished element on (a carry) and the next
 *   piece runs again after it, its first result dropped; a piece that shows where `data`
 *   ends turns every later byte into the tail.
 * - The tail is checked with the head as a skeleton (`validation/skeleton.ts`): validity outside
 *   `data`, and a repeated top-level `columns` or `data` key (refused, as on the plain path;
 *   a repetition inside the head already turns the rows parse-only).
 * - The answer follows the plain path's order: body too large, not JSON (any piece or the
 *   skeleton), a repeated `columns` or `data` key, the first structural issue (columns,
 *   then the first element that is not a list), the column checks, the refused rows (every
 *   row is validated to the end, so the count is exact; lines stop being written at the
 *   first refused row). Only `Invalid JSON format.` is known before the body ends; the
 *   others wait for it, with the rest checked as far as the answer needs.
 * - Back-pressure: at most `piecesPerRequest` pieces are in flight (dispatched and not yet
 *   taken and appended); past that `write` returns false until they drain.
 * - Memory: what the sink must hold whole (the body of a layout it does not stream, the
 *   bytes after `data`, an element longer than a piece, in its cutter buffer or in the
 *   parts of a carry) is reserved from the process's budget as it grows (`memory.ts`):
 *   past the request's bound the answer is 413, past the process's 503. The one-shot task's
 *   parse of a whole body, many times its bytes, waits for room in the pool's `ParseGate`.
 * - Batches are appended to the writer in row order as pieces are taken, as views of the
 *   buffer the worker wrote the lines to, which goes back to the pool once they are stored;
 *   the writer is opened with the first batch and aborted on any failure; the caller commits.
 */
import { Buffer } from 'node:buffer';
import { INVALID_JSON, bodyIssue, columnsError, duplicateKeyMessage, rowNotListIssue } from '../entities/validators.js';
import { ROW_ERRORS_MAX, asServiceError, errors, type RowError, type ServiceError } from '../errors.js';
import type { PackageWriter } from '../store/ports.js';
import {
  HeadScanner,
  Mode,
  PieceCutter,
  parseCost,
  SENTINEL,
  SENTINEL_JSON,
  checkSkeleton,
  type BodyResult,
  type Lines,
  type RowsResult,
  type RowsTask,
  type ScanState,
  type SkeletonFacts,
  type Task,
} from '../validation/index.js';
import type { Engine, IngestOptions, IngestResult, IngestSink } from './types.js';

interface Part {
  buffer: ArrayBuffer;
  start: number;
  end: number;
  /** A carry's part: `parseCost` of its bytes. */
  cost?: number;
}

interface Piece {
  parts: Part[];
  state: ScanState | null;
  first: boolean;
  last: boolean;
  status: 'ready' | 'running' | 'done';
  result: RowsResult | null;
}

interface Carry {
  parts: Part[];
  state: ScanState;
  first: boolean;
}

type Phase = 'head' | 'rows' | 'tail' | 'whole';

const COMMA = Uint8Array.of(0x2c);
const SENTINEL_BYTES = Buffer.from(SENTINEL_JSON);

export class StreamingIngest implements IngestSink {
  readonly #options: IngestOptions;
  readonly #engine: Engine;
  readonly #abort = new AbortController();
  #phase: Phase = 'head';
  /** Past the bytes one request may hold whole (`memory.ts`): 413. */
  #tooLarge = false;
  /** The process's memory budget refused what the sink had to hold: 503. */
  #noMemory = false;
  /** Bytes held whole, by kind (see `#hold`). */
  #wholeBytes = 0;
  #tailBytes = 0;
  #carryBytes = 0;
  #grownBytes = 0;
  /** Not JSON, for certain. */
  #invalid = false;
  /** A task failed (worker crash): an internal error. */
  #failure: { cause: unknown } | null = null;

  readonly #head: HeadScanner;
  /** The whole body, for the one-shot task. */
  #whole: Uint8Array[] = [];
  /** What parsing it will take (`parseCost`). */
  #wholeCost = 0;

  #cutter: PieceCutter | null = null;
  /** By piece number; taken pieces are dropped. */
  #pieces: (Piece | undefined)[] = [];
  /** The next piece to take (all before it are taken). */
  #cursor = 0;
  /** The next piece to dispatch. */
  #dispatched = 0;
  /** Pieces dispatched and not yet taken (and appended). */
  #inFlight = 0;
  #carry: Carry | null = null;

  #headColumns: unknown;
  /** The head's columns when they passed every column check (what the rows are validated against). */
  #columns: string[] = [];
  #mode: Mode = Mode.check;
  /** Batches go to the writer: the columns passed and no row failed so far. */
  #storing = false;

  #rows = 0;
  #bytes = 0;
  #notList: { index: number; input: unknown } | null = null;
  /** The first `ROW_ERRORS_MAX` errors (bad values), in row then column order, and how many there were. */
  #rowErrors: RowError[] = [];
  #errorCount = 0;

  /** Tail bytes, in body order, from `data`'s `]` on; pieces from `#tailFrom` join them at the end. */
  #tail: Uint8Array[] = [];
  #tailFrom = 0;
  #tailRest: Uint8Array[] = [];

  #writer: PackageWriter | null = null;
  #appends: Promise<void> = Promise.resolve();
  #storeError: { cause: unknown } | null = null;

  #full = false;
  #drain: (() => void) | null = null;
  #wake: (() => void) | null = null;
  #ended: Promise<IngestResult> | null = null;
  #settled = false;
  #cleanup: Promise<void> | null = null;

  constructor(options: IngestOptions, engine: Engine) {
    this.#options = options;
    this.#engine = engine;
    this.#head = new HeadScanner(engine.headBytes);
  }

  write(chunk: Uint8Array): boolean {
    if (this.#closed || this.#ended) return true;
    this.#take(chunk);
    if (this.#backlog) this.#full = true;
    return !this.#full;
  }

  onDrain(cb: () => void): void {
    this.#drain = cb;
  }

  get decided(): boolean {
    return this.#closed;
  }

  end(): Promise<IngestResult> {
    this.#ended ??= this.#finish();
    return this.#ended;
  }

  abort(): void {
    if (this.#settled || this.#abort.signal.aborted) return;
    this.#abort.abort();
    this.#drop();
    // Whether or not `end()` comes, the writer is aborted and the admission given back.
    this.end().catch(() => {});
  }

  get #closed(): boolean {
    return this.#abort.signal.aborted || this.#tooLarge || this.#noMemory || this.#invalid || this.#failure !== null;
  }

  /** Reserves what the sink holds whole now; false (and the sink closed with 413 or 503) when refused. */
  #hold(): boolean {
    if (this.#closed) return false;
    const verdict = this.#engine.memory.hold(this.#wholeBytes + this.#tailBytes + this.#carryBytes + this.#grownBytes);
    if (verdict === 'ok') return true;
    if (verdict === 'too-large') this.#tooLarge = true;
    else this.#noMemory = true;
    this.#drop();
    return false;
  }

  /**
   * The cutter asks before it replaces its buffer by a larger one. It doubles up to what one
   * request may hold (`perRequest`, see the cutter's `maxCapacity`), so a row or tail up to
   * that bound fits; a buffer past it counts whole, and is refused (413).
   */
  #grow(capacity: number): boolean {
    const { pieceBytes, memory } = this.#engine;
    this.#grownBytes = capacity > memory.perRequest ? capacity : Math.max(0, capacity - pieceBytes);
    return this.#hold();
  }

  /** Keeps a copy of `chunk` for the one-shot task, if the memory budget allows. */
  #keepWhole(chunk: Uint8Array): void {
    this.#wholeBytes += chunk.byteLength;
    if (!this.#hold()) return;
    this.#whole.push(chunk.slice());
    this.#wholeCost += parseCost(chunk);
  }

  /** Cut pieces wait for a dispatch slot. */
  get #backlog(): boolean {
    return this.#phase === 'rows' && !this.#closed && this.#dispatched < this.#pieces.length;
  }

  #take(chunk: Uint8Array): void {
    switch (this.#phase) {
      case 'head': {
        const at = this.#head.push(chunk, 0);
        if (this.#head.status === 'scanning') return;
        if (this.#head.status === 'other') {
          this.#phase = 'whole';
          this.#keepWhole(this.#head.bytes);
          if (at < chunk.length) this.#keepWhole(chunk.subarray(at));
          return;
        }
        this.#startRows();
        this.#cutter?.push(chunk, at);
        return;
      }
      case 'rows':
        this.#cutter!.push(chunk, 0);
        return;
      case 'tail':
        this.#tailBytes += chunk.byteLength;
        if (this.#hold()) this.#tailRest.push(chunk.slice());
        return;
      case 'whole':
        this.#keepWhole(chunk);
        return;
    }
  }

  #startRows(): void {
    const columns = this.#head.columns();
    if (columns === undefined) {
      this.#invalid = true;
      this.#drop();
      return;
    }
    this.#headColumns = columns;
    if (this.#head.repeated) {
      // Refused once the rest proves to be JSON: the rows only need parsing.
      this.#mode = Mode.parse;
    } else if (bodyIssue({ columns, data: [] }) === null && columnsError(this.#options.entity, columns as string[]) === null) {
      this.#columns = columns as string[];
      this.#mode = Mode.validate;
      this.#storing = true;
    }
    this.#phase = 'rows';
    this.#cutter = new PieceCutter(
      this.#engine.pieceBytes,
      this.#engine.buffers,
      (buffer, length) => this.#addPiece(buffer, length, false),
      (capacity) => this.#grow(capacity),
      // Inflated bodies are larger than declared: only a plain body's length tells.
      this.#options.encoding === 'gzip' ? undefined : (this.#options.declaredBytes ?? undefined),
      this.#engine.memory.perRequest,
    );
  }

  #addPiece(buffer: ArrayBuffer, length: number, last: boolean): void {
    // A grown buffer leaves the cutter with its piece: the piece is in flight, bounded per request.
    this.#grownBytes = 0;
    const first = this.#pieces.length === 0;
    this.#pieces.push({ parts: [{ buffer, start: 0, end: length }], state: null, first, last, status: 'ready', result: null });
    this.#schedule();
  }

  #schedule(): void {
    while (this.#backlog && this.#inFlight < this.#engine.piecesPerRequest) {
      this.#inFlight++;
      this.#dispatch(this.#dispatched++, false);
    }
    if (this.#full && !this.#backlog) {
      this.#full = false;
      this.#drain?.();
    }
  }

  #dispatch(seq: number, priority: boolean): void {
    const piece = this.#pieces[seq]!;
    const carry = seq === this.#cursor ? this.#carry : null;
    if (carry) {
      this.#carry = null;
      piece.parts = [...carry.parts, ...piece.parts];
      piece.state = carry.state;
      piece.first = carry.first;
      this.#engine.stats.continuations++;
    }
    piece.status = 'running';
    this.#recycle(piece);
    this.#engine.stats.pieces++;
    const task: RowsTask = {
      kind: 'rows',
      entity: this.#options.entity.name,
      columns: this.#columns,
      mode: this.#mode,
      // A piece's lines take at most its bytes and a newline.
      out: this.#storing ? this.#engine.buffers.take(piece.parts.reduce((n, p) => n + p.end - p.start, 1)) : null,
      // Pieces taken after the answer's list is full only count their refused rows.
      describe: ROW_ERRORS_MAX - this.#rowErrors.length,
      parts: piece.parts.map((p) => p.buffer),
      ranges: piece.parts.flatMap((p) => [p.start, p.end]),
      state: piece.state,
      first: piece.first,
      last: piece.last,
      batchBytes: this.#engine.batchBytes,
    };
    // A long row (a grown piece, a carry) may be up to `perRequest` long and is parsed whole:
    // its task waits its turn to parse. A piece of the usual size never waits.
    let cost = 0;
    if (piece.parts.reduce((n, p) => n + p.end - p.start, 0) > 2 * this.#engine.pieceBytes) {
      for (const p of piece.parts) cost += p.cost ?? parseCost(new Uint8Array(p.buffer, p.start, p.end - p.start));
    }
    const transfer = [...new Set(task.parts)];
    if (task.out) transfer.push(task.out);
    this.#engine.run<RowsResult>(task, transfer, this.#abort.signal, priority, cost).then(
      (result) => {
        if (result.scanned) this.#engine.stats.scanned++;
        piece.parts = piece.parts.map((p, k) => ({ ...p, buffer: result.parts[k]! }));
        piece.status = 'done';
        piece.result = result;
        if (!this.#closed) this.#consume();
        this.#wakeUp();
      },
      (err: unknown) => {
        piece.status = 'done';
        if (!this.#abort.signal.aborted && !this.#closed) {
          this.#failure = { cause: err };
          this.#drop();
        }
        this.#wakeUp();
      },
    );
  }

  /** Takes finished pieces in order; see the file comment. */
  #consume(): void {
    while (this.#phase === 'rows' && !this.#closed) {
      const seq = this.#cursor;
      const piece = this.#pieces[seq];
      if (!piece) break;
      if (this.#carry) {
        // The piece ran as if its start were a boundary, and it is not: run it again after the carry.
        // Not yet dispatched, it takes the carry when it is; running, it is re-run once back.
        if (piece.status === 'done') this.#dispatch(seq, true);
        break;
      }
      if (piece.status !== 'done') break;
      const result = piece.result!;
      if (!result.ok) {
        this.#invalid = true;
        this.#drop();
        break;
      }
      this.#account(result);
      const keep = new Set<ArrayBuffer>();
      this.#carryBytes = 0;
      if (result.carry) {
        const { part, offset, state } = result.carry;
        const rest = piece.parts.slice(part);
        rest[0] = { ...rest[0]!, start: offset };
        // Held until the element ends: each part in a buffer of its own bytes, not a piece's
        // (a long row's pieces come in grown buffers, up to twice the bytes they hold).
        const parts = rest.map(carried);
        this.#carry = { parts, state, first: piece.first && part === 0 && offset === piece.parts[0]!.start };
        for (const p of parts) {
          keep.add(p.buffer);
          this.#carryBytes += p.buffer.byteLength;
        }
      }
      if (!this.#hold()) break;
      if (result.tail) {
        const part = piece.parts[result.tail.part]!;
        this.#tail = [new Uint8Array(part.buffer, result.tail.offset, part.end - result.tail.offset)];
        keep.add(part.buffer);
        this.#tailBytes += part.buffer.byteLength;
      }
      for (const p of piece.parts) if (!keep.has(p.buffer)) this.#engine.buffers.give(p.buffer);
      this.#pieces[seq] = undefined;
      this.#cursor++;
      if (this.#storing && result.bytes > 0) this.#append({ buffer: result.out!, ends: result.ends }, result.bytes);
      else {
        this.#recycle(piece);
        this.#inFlight--;
      }
      if (result.tail) this.#startTail(seq + 1);
    }
    this.#schedule();
  }

  #account(result: RowsResult): void {
    const base = this.#rows;
    this.#rows += result.rows;
    if (this.#notList) return;
    if (result.notList >= 0) {
      this.#notList = { index: base + result.notList, input: result.notListInput };
      this.#mode = Mode.parse;
      this.#storing = false;
    } else if (result.errorCount > 0) {
      this.#errorCount += result.errorCount;
      for (const { index, column, message } of result.rowErrors) {
        if (this.#rowErrors.length >= ROW_ERRORS_MAX) break;
        this.#rowErrors.push({ row: base + index, column, message });
      }
      // Every later row is still validated (the count is exact), none is stored.
      this.#storing = false;
    }
  }

  /** The buffer a piece's result brought back to the pool, when its lines are not (or no longer) needed. */
  #recycle(piece: Piece): void {
    const out = piece.result?.out;
    piece.result = null;
    if (out) this.#engine.buffers.give(out);
  }

  /** Appends in row order; the piece's dispatch slot is freed (and its buffer given back) once its batches are stored. */
  #append(lines: Lines, bytes: number): void {
    this.#bytes += bytes;
    const { signal } = this.#abort;
    this.#appends = this.#appends
      .then(async () => {
        if (this.#storeError || signal.aborted) return;
        try {
          this.#writer ??= await this.#options.open(this.#columns);
          let start = 0;
          for (const end of lines.ends) {
            if (signal.aborted) return;
            await this.#writer.append(new Uint8Array(lines.buffer, start, end - start));
            start = end;
          }
        } catch (err) {
          // Reported only if the body has no payload error: the plain path validates before it stores.
          this.#storeError = { cause: err };
          this.#storing = false;
        }
      })
      .finally(() => {
        // A writer is done with a batch once its append settled, and every append was awaited.
        this.#engine.buffers.give(lines.buffer);
        this.#inFlight--;
        this.#schedule();
        this.#wakeUp();
      });
  }

  /** `data` ended: every later piece and byte is tail. */
  #startTail(from: number): void {
    this.#phase = 'tail';
    this.#tailFrom = from;
    if (this.#cutter) {
      const rest = this.#cutter.flush();
      this.#cutter = null;
      this.#tailRest = [COMMA, new Uint8Array(rest.buffer, 0, rest.length)];
    }
    this.#schedule();
  }

  /** Releases what the sink holds once its answer is decided (or it was aborted). */
  #drop(): void {
    // Every drop closes the sink: what it held whole is gone, so is its reservation. Given
    // back now, not when the body ends: a refused request that kept it while its client goes
    // on sending would turn away the others that could still finish (or reach their 413).
    this.#engine.memory.release();
    this.#whole = [];
    this.#cutter = null;
    this.#carry = null;
    for (let i = this.#cursor; i < this.#pieces.length; i++) {
      const piece = this.#pieces[i];
      if (piece && piece.status !== 'running') this.#pieces[i] = undefined;
    }
    this.#tail = [];
    this.#tailRest = [];
    if (this.#full) {
      this.#full = false;
      this.#drain?.();
    }
    this.#wakeUp();
  }

  #wakeUp(): void {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }

  #changed(): Promise<void> {
    return new Promise((resolve) => (this.#wake = resolve));
  }

  async #finish(): Promise<IngestResult> {
    try {
      return await this.#conclude();
    } catch (err) {
      await this.#abandon();
      throw this.#abort.signal.aborted ? aborted(this.#abort.signal) : asServiceError(err);
    } finally {
      this.#settled = true;
      this.#engine.release();
    }
  }

  /** Waits for the stored batches to settle, then aborts the writer. */
  #abandon(): Promise<void> {
    this.#cleanup ??= (async () => {
      await this.#appends;
      const writer = this.#writer;
      this.#writer = null;
      await writer?.abort().catch(() => {});
    })();
    return this.#cleanup;
  }

  async #conclude(): Promise<IngestResult> {
    if (this.#phase === 'head' && !this.#closed) {
      // The body ended before `data`'s elements: it is all head.
      this.#phase = 'whole';
      this.#whole = [this.#head.bytes.slice()];
      this.#wholeCost = parseCost(this.#head.bytes);
    }
    if (this.#phase === 'rows' && this.#cutter && !this.#closed) {
      const { buffer, length } = this.#cutter.flush();
      this.#cutter = null;
      this.#addPiece(buffer, length, true);
    }
    for (;;) {
      this.#throwIfDecided();
      if (this.#phase === 'whole') return this.#oneShot(join(this.#whole));
      if (this.#phase === 'tail' && this.#tailSettled()) break;
      await this.#changed();
    }

    const facts = await this.#checkSkeleton();
    this.#throwIfDecided();
    if (!facts.json) throw errors.invalidPayload(INVALID_JSON);
    if (facts.repeated) throw errors.invalidPayload(duplicateKeyMessage(facts.repeated));
    if (this.#head.repeated) throw new Error('The head saw a repeated key the skeleton did not');
    if (facts.columnsIssue) throw errors.validationFailed([facts.columnsIssue]);
    if (this.#notList) throw errors.validationFailed([rowNotListIssue(this.#notList.index, this.#notList.input)]);
    const columnsMessage = columnsError(this.#options.entity, facts.columns!);
    if (columnsMessage) throw errors.invalidPayload(columnsMessage);
    if (this.#errorCount > 0) throw errors.rowsRefused(this.#rowErrors, this.#errorCount);
    return this.#success(this.#columns);
  }

  #throwIfDecided(): void {
    this.#abort.signal.throwIfAborted();
    if (this.#tooLarge) throw errors.bodyTooLarge(this.#engine.memory.perRequest);
    if (this.#noMemory) throw errors.rateLimited(1);
    if (this.#failure) throw errors.internal(this.#failure.cause);
    if (this.#invalid) throw errors.invalidPayload(INVALID_JSON);
  }

  /** Every piece after `data`'s end has come back from its worker (their bytes are tail). */
  #tailSettled(): boolean {
    for (let i = this.#tailFrom; i < this.#pieces.length; i++) if (this.#pieces[i]?.status === 'running') return false;
    return true;
  }

  /** Head (no BOM) + placeholder + `]` + tail, as one buffer of its own (it may be transferred). */
  #skeletonText(): Buffer {
    const tail: Uint8Array[] = [...this.#tail];
    for (let i = this.#tailFrom; i < this.#pieces.length; i++) {
      const piece = this.#pieces[i]!;
      tail.push(COMMA);
      for (const p of piece.parts) tail.push(new Uint8Array(p.buffer, p.start, p.end - p.start));
    }
    tail.push(...this.#tailRest);
    return join([this.#head.bytes.subarray(this.#head.bom), SENTINEL_BYTES, ...tail]);
  }

  async #checkSkeleton(): Promise<SkeletonFacts> {
    const text = this.#skeletonText();
    // Only a list of strings is ever compared with the skeleton's `columns`; anything else
    // may nest deeper than structured cloning to a worker allows (`columns` 30,000 arrays deep).
    const headColumns = Array.isArray(this.#headColumns) && this.#headColumns.every((c) => typeof c === 'string') ? this.#headColumns : null;
    if (text.length <= this.#engine.inlineSkeletonBytes) return checkSkeleton(text, SENTINEL, headColumns);
    this.#engine.stats.skeletonTasks++;
    const buffer = text.buffer as ArrayBuffer;
    // The bytes after `data` may be up to `perRequest` long, and are parsed whole.
    const task: Task = { kind: 'skeleton', text: buffer, sentinel: SENTINEL, headColumns };
    return this.#engine.run<SkeletonFacts>(task, [buffer], this.#abort.signal, true, parseCost(text));
  }

  async #success(columns: string[]): Promise<IngestResult> {
    await this.#appends;
    this.#abort.signal.throwIfAborted();
    if (this.#storeError) throw asServiceError(this.#storeError.cause);
    this.#writer ??= await this.#options.open(columns);
    this.#abort.signal.throwIfAborted();
    return { rows: this.#rows, bytes: this.#bytes, columns, writer: this.#writer };
  }

  #runBody(body: Buffer): Promise<BodyResult> {
    this.#engine.stats.oneShots++;
    const buffer = body.buffer as ArrayBuffer;
    const task: Task = { kind: 'body', body: buffer, entity: this.#options.entity.name, batchBytes: this.#engine.batchBytes };
    return this.#engine.run<BodyResult>(task, [buffer], this.#abort.signal, true, this.#wholeCost);
  }

  async #oneShot(body: Buffer): Promise<IngestResult> {
    this.#whole = [];
    const result = await this.#runBody(body);
    if (!result.ok) throw bodyError(result);
    const { signal } = this.#abort;
    signal.throwIfAborted();
    this.#writer = await this.#options.open(result.columns);
    let start = 0;
    for (const end of result.ends) {
      signal.throwIfAborted();
      await this.#writer.append(new Uint8Array(result.buffer, start, end - start));
      start = end;
    }
    signal.throwIfAborted();
    return { rows: result.rows, bytes: result.bytes, columns: result.columns, writer: this.#writer };
  }
}

function bodyError(result: Extract<BodyResult, { ok: false }>): ServiceError {
  if (result.kind === 'payload') return errors.invalidPayload(result.message);
  if (result.kind === 'rows') return errors.rowsRefused(result.errors, result.count);
  return errors.validationFailed(result.issues);
}

/**
 * A part as a carry holds it: as is when its bytes fill its buffer, else a copy of them in a
 * buffer of their size; with the cost of parsing them (each carried byte is costed once).
 */
function carried(part: Part): Part {
  const length = part.end - part.start;
  if (part.start === 0 && length === part.buffer.byteLength) {
    return part.cost === undefined ? { ...part, cost: parseCost(new Uint8Array(part.buffer, 0, length)) } : part;
  }
  const buffer = new ArrayBuffer(length);
  const bytes = new Uint8Array(buffer);
  bytes.set(new Uint8Array(part.buffer, part.start, length));
  return { buffer, start: 0, end: length, cost: parseCost(bytes) };
}

/** One Buffer of exactly the bytes, not from Buffer's shared pool: it may be transferred. */
function join(chunks: readonly Uint8Array[]): Buffer {
  let size = 0;
  for (const chunk of chunks) size += chunk.byteLength;
  const joined = Buffer.allocUnsafeSlow(size);
  let offset = 0;
  for (const chunk of chunks) {
    joined.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return joined;
}

function aborted(signal: AbortSignal): ServiceError {
  return errors.internal(signal.reason);
}


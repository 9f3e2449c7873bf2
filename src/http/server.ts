/**
 * The edge core: everything of HTTP that does not depend on the server library, so the two
 * adapters (`uws-edge.ts`, `node-edge.ts`) answer alike — head checks, routing, body limits,
 * per-client admission, timeouts, body back-pressure, error bodies and the access-log event.
 * Handlers never see an adapter's objects; the port's types are in `types.ts`. Here: the
 * head checks, routing, admission and the server's life; one exchange, from its handler to
 * its answer (timeouts, body back-pressure, replies), is `exchange.ts`.
 */
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { errors, isServiceError, ServiceError, withHeaders } from '../errors.js';
import { addressAllowed, clientAddress } from './auth.js';
import { ClientLimiter, UNLIMITED } from './client-limiter.js';
import { Exchange, HeldBodies, Inflight, replyFor, wireReply } from './exchange.js';
import { checkHead } from './request-head.js';
import { isRatedPath, Router } from './router.js';
import type { Request, Server, ServerOptions, WireExchange, WireHandlers, WireHead, WireReply } from './types.js';

export { HOLD_MS } from './exchange.js';
export type {
  BodyStream,
  BufferedHandler,
  EdgeName,
  Reply,
  Request,
  RequestContext,
  ResponseEvent,
  Route,
  Server,
  ServerLimits,
  ServerOptions,
  StreamingHandler,
} from './types.js';

/** `limits.bufferedBodyBytes` when the options name none (tests). */
const DEFAULT_BUFFERED_BODY_BYTES = 64 * 1024 * 1024;

const SANE_REQUEST_ID = /^[A-Za-z0-9._:/+=-]{1,128}$/;
const noResponseObserver = (): void => {};

export async function listen(opts: ServerOptions): Promise<Server> {
  const router = new Router(opts.routes, opts.limits);
  const limiter = new ClientLimiter(opts.limits, opts.limiterClock);
  const trusted = opts.trustedProxies ?? null;
  // limits.perIpAtProxy: what the proxy forwards it has counted per client already.
  const limitedHere = (peer: string): boolean => !(opts.limits.perIpAtProxy && trusted !== null && addressAllowed(trusted, peer));
  const observe = opts.onResponse ?? noResponseObserver;
  const inflight = new Inflight(new HeldBodies(opts.limits.bufferedBodyBytes ?? DEFAULT_BUFFERED_BODY_BYTES));

  const onRequest = (head: WireHead, wire: WireExchange): void => {
    const startedAt = performance.now();
    const method = head.method.toUpperCase();
    const checked = checkHead(head);
    const { headers, hasBody } = checked;
    let problem = checked.problem;
    let address = head.remoteAddress;
    if (!problem) {
      try {
        address = clientAddress(head.remoteAddress, headers.get('x-forwarded-for'), trusted);
      } catch (err) {
        problem = isServiceError(err) ? err : errors.invalidForwardedFor();
      }
    }
    const match = router.match(method, head.path);
    const incomingId = headers.get('x-request-id');
    const requestId = incomingId !== undefined && SANE_REQUEST_ID.test(incomingId) ? incomingId : randomUUID();
    const req: Request = {
      method,
      path: head.path,
      query: head.query,
      headers,
      remoteAddress: head.remoteAddress,
      clientAddress: address,
      params: match.params,
      requestId,
      context: {},
    };
    const pattern = match.route?.route.pattern ?? null;
    const answerHeaders = match.route?.route.answerHeaders?.(head.query);
    const answerNow = (err: ServiceError, closeConnection: boolean): void => {
      wire.respond(wireReply(replyFor(answerHeaders ? withHeaders(err, answerHeaders) : err), requestId), closeConnection || inflight.draining);
      observe({ req, route: pattern, status: err.statusCode, durationMs: performance.now() - startedAt });
    };

    // A head that could be read two ways, or that the service refuses whatever its route:
    // answered and the connection closed (what follows on it cannot be trusted).
    if (problem) {
      answerNow(problem, true);
      return;
    }
    // Check 1 of docs/api.md "Check order", answered before any body byte is read: body too large by
    // Content-Length, then the per-client limits. An unread body closes the connection.
    const limit = match.route?.bodyLimit ?? opts.limits.otherBodyBytes;
    if (checked.contentLength !== null && checked.contentLength > limit) {
      answerNow(errors.bodyTooLarge(limit), true);
      return;
    }
    const slot = limitedHere(head.remoteAddress) ? limiter.admit(address, isRatedPath(head.path)) : UNLIMITED;
    if (typeof slot === 'number') {
      answerNow(errors.rateLimited(slot), hasBody);
      return;
    }
    if (!match.route) {
      limiter.release(slot);
      answerNow(match.allowed.length ? errors.methodNotAllowed(match.allowed) : errors.routeNotFound(), hasBody);
      return;
    }
    const exchange = new Exchange(
      wire,
      opts,
      req,
      hasBody,
      limiter,
      slot,
      (status) => observe({ req, route: pattern, status, durationMs: performance.now() - startedAt }),
      inflight,
      answerHeaders,
    );
    const route = match.route.route;
    if (route.body === 'buffered') exchange.runBuffered(route.handler, limit);
    else exchange.runStreaming(route.handler, limit);
  };

  /** A head the adapter's parser refused: answered in the contract's shape, logged like any other. */
  const onRefused = (problem: ServiceError, remoteAddress: string): WireReply => {
    const requestId = randomUUID();
    const req: Request = { method: '-', path: '', query: '', headers: new Map(), remoteAddress, clientAddress: remoteAddress, params: {}, requestId, context: {} };
    observe({ req, route: null, status: problem.statusCode, durationMs: 0 });
    return wireReply(replyFor(problem), requestId);
  };
  const handlers: WireHandlers = { request: onRequest, refused: onRefused };

  // An address still taken (a previous process's connections in TIME_WAIT, where the library
  // binds without SO_REUSEADDR) is waited out for `listenRetryMs`.
  const deadline = Date.now() + (opts.port === 0 ? 0 : (opts.listenRetryMs ?? 0));
  let listener = await opts.edge.listen(opts.host, opts.port, handlers);
  if (!listener && Date.now() < deadline) opts.onListenRetry?.(deadline - Date.now());
  while (!listener && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 250));
    listener = await opts.edge.listen(opts.host, opts.port, handlers);
  }
  if (!listener) throw new Error(`Cannot listen on ${opts.host}:${opts.port}`);
  const bound = listener;
  return {
    port: bound.port,
    edge: opts.edge.name,
    close: () => bound.close(),
    drain: (graceMs) => {
      inflight.draining = true;
      bound.close();
      return inflight.drain(graceMs);
    },
  };
}

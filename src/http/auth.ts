/**
 * Client authentication: tokens at rest only as SHA-256, compared in constant time; the
 * check order of docs/api.md (token, Client-Id, token-to-client, source IP).
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { BlockList, isIP } from 'node:net';
import typia, { tags } from 'typia';
import { parseCidr } from '../config/config.js';
import { errors } from '../errors.js';

export interface ClientEntry {
  client_id: string & tags.MinLength<1> & tags.MaxLength<128>;
  token_sha256: string & tags.Pattern<'^[0-9a-f]{64}$'>;
  allowed_ips: string[];
  min_date: string & tags.Pattern<'^\\d{4}-\\d{2}-\\d{2}$'>;
}

export interface ClientsFile {
  clients: ClientEntry[];
}

export interface Client {
  readonly id: string;
  /** Earliest `date_from` this client may ask for, `YYYY-MM-DD`. */
  readonly minDate: string;
}

interface LoadedClient extends Client {
  hash: Buffer;
  allowed: BlockList;
}

const validateClientsFile = typia.createValidate<ClientsFile>();
const BEARER = /^bearer[ \t]+/i;

export function hashToken(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex');
}

/** Builds a BlockList from CIDRs or single addresses (IPv4 and IPv6). Throws on a bad entry. */
export function addressList(entries: readonly string[], what: string): BlockList {
  const list = new BlockList();
  for (const entry of entries) {
    const cidr = parseCidr(entry);
    if (!cidr) throw new Error(`${what}: not an IP address or CIDR: ${JSON.stringify(entry)}`);
    list.addSubnet(cidr.address, cidr.prefix, cidr.family === 6 ? 'ipv6' : 'ipv4');
  }
  return list;
}

/** The address family (4 or 6) of a plain IP address; 0 for anything else, an IPv6 zone id (`fe80::1%eth0`) included. */
function plainIp(address: string): 0 | 4 | 6 {
  return address.includes('%') ? 0 : (isIP(address) as 0 | 4 | 6);
}

export function addressAllowed(list: BlockList, address: string): boolean {
  const family = plainIp(address);
  return family !== 0 && list.check(address, family === 6 ? 'ipv6' : 'ipv4');
}

export class ClientRegistry {
  private readonly byHash = new Map<string, LoadedClient>();

  constructor(file: ClientsFile, source = 'clients file') {
    const result = validateClientsFile(file);
    if (!result.success) {
      const e = result.errors[0]!;
      throw new Error(`${source}: ${e.path.replace(/^\$input\.?/, '')}: expected ${e.expected}`);
    }
    const ids = new Set<string>();
    for (const [i, c] of file.clients.entries()) {
      if (ids.has(c.client_id)) throw new Error(`${source}: clients[${i}].client_id: duplicate ${JSON.stringify(c.client_id)}`);
      if (this.byHash.has(c.token_sha256)) throw new Error(`${source}: clients[${i}].token_sha256: shared with another client`);
      ids.add(c.client_id);
      this.byHash.set(c.token_sha256, {
        id: c.client_id,
        minDate: c.min_date,
        hash: Buffer.from(c.token_sha256, 'hex'),
        allowed: addressList(c.allowed_ips, `${source}: clients[${i}].allowed_ips`),
      });
    }
  }

  static fromFile(path: string): ClientRegistry {
    let parsed: unknown;
    try {
      parsed = JSON.parse(readFileSync(path, 'utf8'));
    } catch (err) {
      throw new Error(`clients file ${path}: ${(err as Error).message}`);
    }
    return new ClientRegistry(parsed as ClientsFile, `clients file ${path}`);
  }

  get size(): number {
    return this.byHash.size;
  }

  /** Every configured client id. */
  ids(): string[] {
    return [...this.byHash.values()].map((c) => c.id);
  }

  /**
   * Answers the client or throws the first failing check's error. The token is looked up by
   * its SHA-256 (a uniformly random key, so the lookup's timing says nothing about the
   * token) and then confirmed with a constant-time comparison.
   */
  authenticate(authorization: string | undefined, clientId: string | undefined, address: string): Client {
    // The scheme is case-insensitive (RFC 9110 §11.1); the token alone is accepted too.
    const token = authorization?.replace(BEARER, '').trim();
    if (!token) throw errors.authRequired();
    const presented = createHash('sha256').update(token, 'utf8').digest();
    const client = this.byHash.get(presented.toString('hex'));
    if (!client || !timingSafeEqual(presented, client.hash)) throw errors.authRequired();
    if (!clientId) throw errors.clientIdMissing();
    if (clientId !== client.id) throw errors.authRequired();
    if (!addressAllowed(client.allowed, address)) throw errors.ipNotAllowed();
    return client;
  }
}

/**
 * The client's address: the socket peer, or — when the peer is a trusted proxy — the
 * right-most `X-Forwarded-For` entry that is not itself a trusted proxy. `forwardedFor` is
 * every line of the header joined with `,` (RFC 9110 §5.3). An entry read on the way that is
 * not a plain IP address throws INVALID_FORWARDED_FOR: the proxies the service trusts wrote
 * it, and falling back to the proxy's own address would pool every client behind it.
 */
export function clientAddress(remote: string, forwardedFor: string | undefined, trusted: BlockList | null): string {
  if (!trusted || forwardedFor === undefined || !addressAllowed(trusted, remote)) return remote;
  const hops = forwardedFor.split(',').map((s) => s.trim());
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = hops[i]!;
    if (!plainIp(hop)) throw errors.invalidForwardedFor();
    if (!addressAllowed(trusted, hop)) return hop;
  }
  return hops[0]!;
}

/**
 * An IPv4-mapped IPv6 peer address (`::ffff:a.b.c.d`, or uWS's `0000:…:ffff:7f00:0001`) as
 * plain IPv4; any other address as given.
 */
export function normaliseAddress(text: string): string {
  const mapped = /^(?:0{1,4}:){5}ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(text);
  if (mapped) {
    const hi = parseInt(mapped[1]!, 16);
    const lo = parseInt(mapped[2]!, 16);
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  const dotted = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(text);
  return dotted ? dotted[1]! : text;
}

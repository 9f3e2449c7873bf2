/**
 * Every link inside the repository resolves: for each Markdown file (README.md,
 * CHANGELOG.md, docs/*.md, bench/**, config/**), every relative link or image
 * `[text](path#anchor)` (and `[name]: path` definitions) names a file or folder the
 * repository holds, and an anchor names a heading of the Markdown file it points into, by
 * GitHub's rules (lowercase; punctuation but `-` and `_` dropped; each space a `-`; a repeated
 * heading gets `-1`, `-2`, …). Code blocks and code spans are not read. And no Markdown file,
 * nor any TypeScript file of src/, scripts/, test/, testbed/ or bench/, names a
 * file that lives outside the repository (the notes this project was once written from).
 */
import { existsSync, statSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import { dirname, join, relative, resolve, sep } from 'node:path';
import t from 'tap';

const ROOT = resolve(import.meta.dirname, '../../..');
const SKIP = new Set(['node_modules', '.tools', 'dist', '.git', '.tap', 'data', 'tmp']);
/** Folders no link may point into: installed, fetched or built, not part of the repository. */
const NOT_OURS = new Set(['node_modules', '.tools', 'dist', '.git']);

/** Spelled in pieces, so that this file does not name them itself. */
const FORBIDDEN = [['DECISIONS', 'md'].join('.'), ['..', 'shared'].join('/')];

async function walk(folder: string, keep: (name: string) => boolean): Promise<string[]> {
  if (!existsSync(join(ROOT, folder))) return [];
  const out: string[] = [];
  for (const entry of await readdir(join(ROOT, folder), { withFileTypes: true })) {
    if (SKIP.has(entry.name)) continue;
    const path = join(folder, entry.name);
    if (entry.isDirectory()) out.push(...(await walk(path, keep)));
    else if (entry.isFile() && keep(entry.name)) out.push(path);
  }
  return out;
}

const isMarkdown = (name: string) => name.endsWith('.md');

async function markdownFiles(): Promise<string[]> {
  const top = ['README.md', 'CHANGELOG.md'].filter((f) => existsSync(join(ROOT, f)));
  const docs = (await readdir(join(ROOT, 'docs'))).filter(isMarkdown).map((f) => join('docs', f));
  return [...top, ...docs, ...(await walk('bench', isMarkdown)), ...(await walk('config', isMarkdown))].sort();
}

/** The text with fenced code blocks blanked (lines kept) and code spans replaced by a word. */
export function prose(text: string): string {
  const lines = text.split('\n');
  let fence: string | null = null;
  for (let i = 0; i < lines.length; i++) {
    const open = /^\s{0,3}(`{3,}|~{3,})/.exec(lines[i]!);
    if (fence === null && open) {
      fence = open[1]!;
      lines[i] = '';
    } else if (fence !== null) {
      if (new RegExp(`^\\s{0,3}${fence[0]}{${fence.length},}\\s*$`).test(lines[i]!)) fence = null;
      lines[i] = '';
    }
  }
  return lines.join('\n').replace(/(`+)(?:(?!\1)[\s\S])+?\1/g, (span) => span.replace(/[^\n]/g, 'x'));
}

/** GitHub's anchor of a heading's text (github-slugger on the rendered text). */
export function slug(heading: string): string {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // links and images: their text
    .replace(/<[^>]+>/g, '') // inline HTML
    .replace(/`/g, '')
    .trim()
    .toLowerCase();
  return text.replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replace(/ /g, '-');
}

/** Every anchor a file's headings make, repeated headings numbered as GitHub numbers them. */
export function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  const lines = text.split('\n');
  const raw = text.split('\n');
  const code = prose(text).split('\n');
  for (let i = 0; i < lines.length; i++) {
    let heading: string | undefined;
    const atx = /^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$/.exec(code[i]!);
    if (atx) heading = raw[i]!.replace(/^\s{0,3}#{1,6}\s+/, '').replace(/\s+#+\s*$/, '');
    else if (i > 0 && /^\s{0,3}(=+|-+)\s*$/.test(code[i]!) && code[i - 1]!.trim() !== '' && !/^\s*[-*|>]/.test(code[i - 1]!)) heading = raw[i - 1]!;
    if (heading === undefined) continue;
    const base = slug(heading);
    const n = seen.get(base);
    out.add(n === undefined ? base : `${base}-${n}`);
    seen.set(base, (n ?? 0) + 1);
  }
  return out;
}

/** The targets of inline links, images and link definitions, with their line numbers. */
export function links(text: string): { target: string; line: number }[] {
  const body = prose(text);
  const out: { target: string; line: number }[] = [];
  const lineOf = (at: number) => body.slice(0, at).split('\n').length;
  for (const m of body.matchAll(/!?\[(?:[^\][]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)/g)) {
    out.push({ target: m[1]!.replace(/^<|>$/g, ''), line: lineOf(m.index!) });
  }
  for (const m of body.matchAll(/^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)/gm)) {
    out.push({ target: m[1]!.replace(/^<|>$/g, ''), line: lineOf(m.index!) });
  }
  return out;
}

/** Why a link of `file` does not resolve, or null when it does. */
async function broken(file: string, target: string, headings: (file: string) => Promise<Set<string>>): Promise<string | null> {
  if (/^[a-z][a-z\d+.-]*:/i.test(target) || target.startsWith('//')) return null; // http:, https:, mailto:
  const hash = target.indexOf('#');
  const pathPart = hash < 0 ? target : target.slice(0, hash);
  let path: string;
  let anchor: string | null;
  try {
    path = decodeURIComponent(pathPart.split('?')[0]!);
    anchor = hash < 0 ? null : decodeURIComponent(target.slice(hash + 1));
  } catch {
    return 'not a valid URL path';
  }
  const absolute = path === '' ? join(ROOT, file) : path.startsWith('/') ? join(ROOT, path) : resolve(ROOT, dirname(file), path);
  const inside = relative(ROOT, absolute);
  if (inside === '..' || inside.startsWith(`..${sep}`)) return `${path} is outside the repository`;
  if (inside.split(sep).some((part) => NOT_OURS.has(part))) return `${path} is not part of the repository (${inside})`;
  if (!existsSync(absolute)) return `${path} does not exist (${inside})`;
  if (anchor === null || anchor === '') return null;
  if (statSync(absolute).isFile() && absolute.endsWith('.md')) {
    return (await headings(inside)).has(anchor) ? null : `${inside} has no heading #${anchor}`;
  }
  return /^L\d+(-L\d+)?$/.test(anchor) ? null : `#${anchor}: only Markdown headings and line numbers are anchors (${inside})`;
}

t.test('GitHub anchors', async (t) => {
  t.equal(slug('The NATS server: 2.10 or later, `sync_interval: always`'), 'the-nats-server-210-or-later-sync_interval-always');
  t.equal(slug('Distributed engines (NATS JetStream + S3)'), 'distributed-engines-nats-jetstream--s3');
  t.equal(slug("A client's sessions"), 'a-clients-sessions');
  t.equal(slug('Bodies that inflate (memory)'), 'bodies-that-inflate-memory');
  t.equal(slug('**Bold** and [a link](x.md) — here'), 'bold-and-a-link--here');
  const doc = '# Title\n## Same\n```sh\n# not a heading\n```\n## Same\nSetext\n---\n## Same\n';
  t.same([...anchors(doc)], ['title', 'same', 'same-1', 'setext', 'same-2']);
});

t.test('links are found outside code only', async (t) => {
  const doc = 'a [x](one.md#b) `[y](two.md)` ![i](pic.svg "t")\n```\n[z](three.md)\n```\n[`code`](four.md) [d]: five.md\n\n[e]: <six seven.md>\n';
  t.same(
    links(doc).map((l) => l.target),
    ['one.md#b', 'pic.svg', 'four.md', 'six seven.md'],
  );
});

t.test('every relative link of every Markdown file resolves, anchors included', async (t) => {
  const files = await markdownFiles();
  t.ok(files.includes('README.md') && files.includes(join('docs', 'api.md')), `${files.length} Markdown files`);
  const cache = new Map<string, Set<string>>();
  const headings = async (file: string) => {
    let set = cache.get(file);
    if (!set) cache.set(file, (set = anchors(await readFile(join(ROOT, file), 'utf8'))));
    return set;
  };
  let checked = 0;
  for (const file of files) {
    const text = await readFile(join(ROOT, file), 'utf8');
    for (const { target, line } of links(text)) {
      const why = await broken(file, target, headings);
      checked++;
      if (why !== null) t.fail(`${file}:${line}: (${target}) ${why}`);
    }
  }
  t.ok(checked > 100, `${checked} links checked`);
});

t.test('no file names notes that live outside the repository', async (t) => {
  const ts = (name: string) => name.endsWith('.ts');
  const files = [
    ...(await markdownFiles()),
    ...(await Promise.all(['src', 'scripts', 'test', 'testbed', 'bench'].map((f) => walk(f, ts)))).flat(),
  ];
  t.ok(files.length > 100, `${files.length} files read`);
  for (const file of files) {
    const text = (await readFile(join(ROOT, file), 'utf8')).toLowerCase();
    for (const name of FORBIDDEN) {
      const at = text.indexOf(name.toLowerCase());
      if (at >= 0) t.fail(`${file}:${text.slice(0, at).split('\n').length} names ${name}`);
    }
  }
});

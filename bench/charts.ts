/**
 * The bench report's charts, as SVG files beside the Markdown: MB/s by scenario and server
 * (the ceiling as a rule), the server's CPU ms per MB split by thread, and latency
 * percentiles (requests and the status poller). Vega-Lite specs rendered headless by Vega
 * (no browser, no canvas: the SVG renderer measures text itself).
 */
import { parse, View } from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';
import { perMb, type Measurement, type Report } from './report.js';

const WIDTH = 480;

async function svg(spec: TopLevelSpec): Promise<string> {
  const view = new View(parse(compile(spec).spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

const title = (report: Report, m: Measurement) => {
  const s = report.scenarios.find((x) => x.id === m.scenario)?.title ?? m.scenario;
  return m.round > 1 ? `${s} (run ${m.round})` : s;
};

const firstRounds = (report: Report) => report.measurements.filter((m) => m.round === 1 && m.load.ok > 0);

function throughput(report: Report): TopLevelSpec {
  const values = firstRounds(report).map((m) => ({ scenario: title(report, m), server: m.server, mbps: m.load.mbPerSec }));
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: 'Throughput, MB/s (higher is better)', subtitle: report.ceiling ? `rule: the ceiling, JSON.parse of resident pieces on ${report.ceiling.threads} threads` : '' },
    width: WIDTH,
    height: 260,
    layer: [
      {
        data: { values },
        mark: 'bar',
        encoding: {
          x: { field: 'scenario', type: 'nominal', title: null, axis: { labelAngle: -20 }, sort: null },
          xOffset: { field: 'server', sort: null },
          y: { field: 'mbps', type: 'quantitative', title: 'MB/s' },
          color: { field: 'server', type: 'nominal', sort: null },
          tooltip: [{ field: 'server' }, { field: 'mbps', format: '.1f' }],
        },
      },
      ...(report.ceiling
        ? [
            {
              data: { values: [{ ceiling: report.ceiling.parse.mbPerSec }] },
              mark: { type: 'rule', strokeDash: [6, 4], color: '#444' },
              encoding: { y: { field: 'ceiling', type: 'quantitative' } },
            },
          ]
        : []),
    ],
  } as TopLevelSpec;
}

function cpu(report: Report): TopLevelSpec {
  const values = firstRounds(report).flatMap((m) => {
    const t = m.probe?.cpuByThread;
    if (!t) return [];
    const label = `${title(report, m)} · ${m.server}`;
    return [
      { run: label, thread: 'main (event loop)', ms: perMb(t.mainMs, m.load) },
      { run: label, thread: 'validation workers', ms: perMb(t.workersMs, m.load) },
      { run: label, thread: 'other (libuv pool, GC helpers)', ms: perMb(t.otherMs, m.load) },
    ];
  });
  const ceilingMs = report.ceiling ? (report.ceiling.threads * 1000) / report.ceiling.parse.mbPerSec : null;
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: 'Server CPU ms per MB, by thread (lower is better)', subtitle: ceilingMs ? `rule: the ceiling's bare JSON.parse, ${ceilingMs.toFixed(1)} ms per MB` : '' },
    width: WIDTH,
    height: { step: 16 },
    layer: [
      {
        data: { values },
        mark: 'bar',
        encoding: {
          y: { field: 'run', type: 'nominal', title: null, sort: null, axis: { labelLimit: 320 } },
          x: { field: 'ms', type: 'quantitative', title: 'CPU ms per MB', stack: 'zero' },
          color: { field: 'thread', type: 'nominal', sort: null },
          tooltip: [{ field: 'run' }, { field: 'thread' }, { field: 'ms', format: '.1f' }],
        },
      },
      ...(ceilingMs
        ? [{ data: { values: [{ ceiling: ceilingMs }] }, mark: { type: 'rule', strokeDash: [6, 4], color: '#444' }, encoding: { x: { field: 'ceiling', type: 'quantitative' } } }]
        : []),
    ],
  } as TopLevelSpec;
}

function latency(report: Report): TopLevelSpec {
  const values = report.measurements
    .filter((m) => m.load.ok > 0)
    .flatMap((m) => {
      const base = { scenario: title(report, m), server: m.server };
      return [
        { ...base, measure: 'request p50', ms: m.load.latencyP50Ms },
        { ...base, measure: 'request p99', ms: m.load.latencyP99Ms },
        ...(m.status ? [{ ...base, measure: 'status p50 during the load', ms: m.status.p50Ms }, { ...base, measure: 'status p99 during the load', ms: m.status.p99Ms }] : []),
      ];
    })
    .filter((v) => Number.isFinite(v.ms) && v.ms > 0);
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: 'Latency percentiles, ms (lower is better; each panel its own scale)', subtitle: 'status: GET …/status every 10 ms while the load runs' },
    data: { values },
    resolve: { scale: { y: 'independent' } },
    facet: { row: { field: 'measure', type: 'nominal', title: null, sort: ['request p50', 'request p99', 'status p50 during the load', 'status p99 during the load'] } },
    spec: {
      width: WIDTH,
      height: 120,
      mark: 'bar',
      encoding: {
        x: { field: 'scenario', type: 'nominal', title: null, axis: { labelAngle: -20 }, sort: null },
        xOffset: { field: 'server', sort: null },
        y: { field: 'ms', type: 'quantitative', title: 'ms' },
        color: { field: 'server', type: 'nominal', sort: null },
        tooltip: [{ field: 'server' }, { field: 'measure' }, { field: 'ms', format: '.1f' }],
      },
    },
  } as TopLevelSpec;
}

/** The three charts as SVG text, by the name they are written under (after the run's stamp). */
export async function renderCharts(report: Report): Promise<Record<string, string>> {
  return {
    'throughput.svg': await svg(throughput(report)),
    'cpu-by-thread.svg': await svg(cpu(report)),
    'latency.svg': await svg(latency(report)),
  };
}
